"""Which CPU a machine of several processes gets (host.cpu_sets.place): pure placement, no cgroups."""

from dtemu.host import cpu_sets


def test_machines_of_several_processes_get_a_cpu_of_their_own_where_their_share_fits(monkeypatch):
    monkeypatch.setattr(cpu_sets, "unavailable", lambda: None)
    # the held-out geo row: two sites of four ranks, the central machine of two; three 0.533 shares
    assert cpu_sets.place([0.533, 0.533, 0.533], [4, 4, 2], cpus=[0, 1]) == [0, 1, None]
    # ... in the plan's order too: the machines of the most processes first
    assert cpu_sets.place([0.533, 0.533, 0.533], [2, 4, 4], cpus=[0, 1]) == [None, 0, 1]
    # the largest share first, each on the CPU with the most room left
    assert cpu_sets.place([0.2, 0.7, 0.3, 0.25], [2, 2, 2, 2], cpus=[0, 1]) == [1, 0, 1, 1]
    # ten small machines alternate, and no CPU holds more than a CPU's worth
    on = cpu_sets.place([0.145] * 10, [2] * 10, cpus=[0, 1])
    assert on == [0, 1] * 5
    # a machine of one process runs where the kernel puts it, and so does a share of more than a CPU
    assert cpu_sets.place([0.5, 0.5, 1.5], [1, 1, 3], cpus=[0, 1]) == [None, None, None]


def test_no_cpu_is_given_where_pinning_is_off_or_there_are_no_cpus(monkeypatch):
    monkeypatch.setenv("DTEMU_CPU_PIN", "0")
    assert cpu_sets.unavailable() == "turned off (DTEMU_CPU_PIN=0)"
    assert cpu_sets.place([0.5, 0.5], [3, 3], cpus=[0, 1]) == [None, None]
    monkeypatch.setattr(cpu_sets, "unavailable", lambda: None)
    assert cpu_sets.place([0.5], [3], cpus=[]) == [None]


def test_kernel_cpu_lists_are_read():
    assert cpu_sets.parse_list("0-2,4\n") == [0, 1, 2, 4]
    assert cpu_sets.parse_list("1") == [1]
    assert cpu_sets.parse_list("") == []
