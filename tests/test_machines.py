"""Machines on one box, without root: the plan, the monitors' rules, the refusal (real.machines,
real.monitors).  What needs root (the namespaces, the groups, the monitors on a live testbed) is
tests/test_machines_root.py."""

import json

import pytest

from dtemu.host.scenario_file import load_scenario
from dtemu.core.runtime import machine_plan as M
from dtemu.real.machine_net import parse_qdiscs
from dtemu.real.monitors import (BUCKET_SLACK, BoxTrack, CpuTrack, Limits, LinkTrack, Samples, box_window, cpu_window, judge,
                                 link_window)
from dtemu.real.timer_lateness import Lateness


def test_every_fl_node_is_a_machine_behind_its_link_slowed_by_the_time_scale():
    s = load_scenario("scenarios/fl_straggler.yaml")
    p = M.plan(s, 2, scale=10.0)
    assert p.machines == ["controller", "client1", "client2", "client3", "client4"]
    assert p.of_node == {n: i for i, n in enumerate(p.machines)}
    # 50 up / 100 down / 10 ms by default; client2's uplink is 5 Mbit/s
    assert p.links[1] == M.LinkSpec(5.0, 10.0, 100.0, 0.0)
    assert p.links[2].up_mbps == pytest.approx(0.5)
    # 0.8 of the box's two cores, split five ways
    assert p.cpus == [0.32] * 5


def test_a_geo_site_is_one_machine_behind_its_wan():
    s = load_scenario("scenarios/geo_hips.yaml")
    p = M.plan(s, 2)
    site_of = s.site_of
    assert p.machines == list(dict.fromkeys(site_of[n] for n in s.node_names))
    for node, m in p.of_node.items():
        assert p.machines[m] == site_of[node]
    for name, link in zip(p.machines, p.links):
        wan = s.network.sites[name].wan
        assert (link.up_mbps, link.down_mbps, link.latency_ms) == (wan.up_mbps, wan.down_mbps, wan.latency_ms)
    assert sum(p.cpus) <= 1.6 + 1e-9


def test_shares_over_the_box_are_refused():
    s = load_scenario("scenarios/fl_straggler.yaml")
    with pytest.raises(M.MachinesRefused, match="machines that share cores"):
        M.plan(s, 2, cpus=0.5)
    assert M.plan(s, 2, cpus=0.3).cpus == [0.3] * 5


@pytest.mark.parametrize("cpus, period, quota", [(0.533, 5000, 2665), (0.2, 5000, 1000), (0.145, 6897, 1000),
                                                 (0.05, 20000, 1000), (1.5, 5000, 7500)])
def test_a_share_under_a_fifth_of_a_core_keeps_its_value_by_a_longer_period(cpus, period, quota):
    """The kernel's smallest quota is 1 ms: over the 5 ms period that is 0.2 of a core, so a smaller
    share takes a period just long enough (rounded up to 0.2, eleven Flower machines of 0.145 got 0.2)."""
    from dtemu.host.cpu_shares import CpuGroup

    g = CpuGroup("x", cpus)
    assert (g.period_us, g.quota_us) == (period, quota)
    assert g.quota_us / g.period_us == pytest.approx(cpus, rel=1e-3)


def test_without_root_launch_refuses_in_one_line(monkeypatch, capsys):
    from dtemu.real import cli

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    code = cli.main(["launch", "scenarios/fl_straggler.yaml", "--machines", "netns", "--no-tui"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == ["real launch: --machines netns refused: needs root (ip netns, tc, cgroups)"]


def _clean(seconds: float = 10.0) -> Samples:
    s = Samples(seconds=seconds, count=40)
    s.cpu["a"] = CpuTrack(0.4, used_s=4.0, throttled_s=5.0, wanted_s=4.0, short_s=0.1)
    s.links["a.up"] = LinkTrack(10e6, set_bps=10e6, bytes=10_000_000, busy_bytes=2_500_000, busy_s=2.0)
    return s


def test_a_clean_testbed_is_faithful():
    v = judge(_clean(), {"a": {"count": 50, "p99_ms": 2.0, "max_ms": 4.0}})
    assert v["faithful"] and v["why"] == []
    assert v["machines"]["a"]["starved"] == pytest.approx(0.025)
    assert v["links"]["a.up"]["busy_mbps"] == pytest.approx(10.0)


def test_socket_drops_are_recorded_and_not_judged():
    from dtemu.real.socket_drops import between, parse_udp

    snmp = ("Ip: Forwarding DefaultTTL\nIp: 1 64\n"
            "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti\n"
            "Udp: 1200 3 40 900 37 0 0 0\nUdpLite: InDatagrams\nUdpLite: 0\n")
    end = parse_udp(snmp)
    assert end == {"in_datagrams": 1200, "in_errors": 40, "rcvbuf_errors": 37, "sndbuf_errors": 0}
    assert parse_udp("Udp: InDatagrams\n") == {} and parse_udp("") == {}
    start = {"ns-a": {"in_datagrams": 200, "in_errors": 0, "rcvbuf_errors": 0, "sndbuf_errors": 0}, "ns-b": {}}
    assert between(start, {"ns-a": end, "ns-b": end}) == {"ns-a": {"in_datagrams": 1000, "in_errors": 40,
                                                                    "rcvbuf_errors": 37, "sndbuf_errors": 0}}
    samples = _clean()
    samples.sockets = between(start, {"ns-a": end})
    v = judge(samples)
    assert v["faithful"] and v["sockets"]["ns-a"]["rcvbuf_errors"] == 37


def test_each_monitor_trips_on_its_own():
    starved = _clean()
    starved.cpu["a"].short_s = 1.0
    assert "machine a received 25% less CPU" in judge(starved)["why"][0]

    wrong_rate = _clean()
    wrong_rate.links["a.up"].set_bps = 5e6
    assert judge(wrong_rate)["why"] == ["link a.up is set to 5 Mbit/s, the scenario's is 10"]

    slow = _clean()
    slow.links["a.up"].busy_bytes = 1_250_000  # 5 Mbit/s over its 2 busy seconds
    assert judge(slow)["why"] == ["link a.up moved 5 Mbit/s while busy, the scenario's rate is 10"]

    dropped = _clean()
    dropped.links["a.up"].drops = 3
    assert judge(dropped)["why"] == ["link a.up dropped 3 packets (its queue overflowed)"]
    assert judge(dropped, planned_loss=0.01)["faithful"]  # drops the scenario asked for

    late = judge(_clean(), {"a": {"count": 9, "p99_ms": 30.0, "max_ms": 40.0}})
    assert late["why"] == ["the roles' timers woke late: p99 30.0 ms, max 40.0 ms"]

    gone = _clean()
    gone.links["a.up"].gone = True
    assert "went away" in judge(gone)["why"][0]

    stolen = _clean()
    stolen.box = BoxTrack(seconds=20.0, steal_s=2.0, busy_s=10.0)
    assert judge(stolen)["why"] == ["the hypervisor took 10% of the box's CPU (steal time): every machine and link "
                                    "ran slower than its share and rate say"]
    assert judge(stolen)["box"]["outside_machines_cpus"] == pytest.approx(0.6)  # 10 busy - 4 used, over 10 s


def test_a_short_busy_spell_is_not_judged():
    s = _clean()
    s.links["a.up"].busy_s, s.links["a.up"].busy_bytes = 0.2, 10_000  # too little to judge a rate on
    assert judge(s, limits=Limits())["faithful"]


def test_the_box_counts_steal_from_proc_stat_ticks():
    box = BoxTrack()
    box_window(box, (1000, 400, 10))
    box_window(box, (1200, 500, 16))
    hz = __import__("os").sysconf("SC_CLK_TCK")
    assert (box.seconds, box.busy_s, box.steal_s) == (200 / hz, 100 / hz, 6 / hz)


def test_cpu_windows_count_only_the_time_the_machine_wanted_cpu():
    t = CpuTrack(0.5)
    cpu_window(t, (0.0, 0.0, 0.0, {1: (0.0, 0.0)}))
    # 1 s window: thread 1 ran 0.3 s and waited 0.3 s (runnable 0.6 s); the group used 0.3 s
    cpu_window(t, (1.0, 0.3, 0.2, {1: (0.3, 0.3)}))
    assert t.wanted_s == pytest.approx(0.3) and t.short_s == pytest.approx(0.0)
    # next second: runnable all of it, but used only 0.2 s of the 0.5 its share gives
    cpu_window(t, (2.0, 0.5, 0.2, {1: (0.5, 1.1), 2: (0.0, 0.1)}))
    assert t.wanted_s == pytest.approx(0.8) and t.short_s == pytest.approx(0.3)
    assert t.used_s == pytest.approx(0.5) and t.throttled_s == pytest.approx(0.2)


def test_link_windows_measure_the_rate_only_while_the_queue_cannot_run_dry():
    k = LinkTrack(8e6)   # 1 MB/s
    link_window(k, 0.0, {"bytes": 0, "backlog": 0, "drops": 0, "rate_bps": 8e6})
    link_window(k, 1.0, {"bytes": 500_000, "backlog": 300_000, "drops": 0, "rate_bps": 8e6})  # idle at the start
    link_window(k, 2.0, {"bytes": 900_000, "backlog": 1_200_000, "drops": 0, "rate_bps": 8e6})  # 0.3 MB queued: not enough
    link_window(k, 3.0, {"bytes": 1_900_000, "backlog": 900_000, "drops": 0, "rate_bps": 8e6})  # 1.2 MB queued: busy
    assert (k.bytes, k.busy_bytes, k.busy_s) == (1_900_000, 1_000_000, 1.0)


def test_tc_json_is_read_per_device_with_the_drops_of_a_netem_in_front():
    text = json.dumps([
        {"kind": "noqueue", "dev": "lo", "bytes": 0},
        {"kind": "netem", "dev": "eth0", "drops": 2, "bytes": 100},
        {"kind": "tbf", "dev": "eth0", "options": {"rate": 1250000}, "bytes": 7000, "packets": 5, "drops": 1,
         "backlog": 1514},
        {"kind": "tbf", "dev": "p1", "options": {"rate": "100Mbit"}, "bytes": 1, "packets": 1}])
    stats = parse_qdiscs(text)
    assert stats["eth0"] == {"bytes": 7000, "packets": 5, "drops": 3, "backlog": 1514, "rate_bps": 10e6}
    assert stats["p1"]["rate_bps"] == 100e6 and "lo" not in stats
    assert parse_qdiscs("not json") == {}


def test_timer_lateness_keeps_its_percentiles():
    late = Lateness()
    assert late.record() == {"count": 0}
    for ms in range(100):
        late.note(ms / 1e3)
    late.note(-0.001)  # a hair early is on time
    r = late.record()
    assert r["count"] == 101 and r["max_ms"] == 99.0 and r["p50_ms"] == 49.0 and r["p99_ms"] == 98.0


def test_a_link_that_carries_more_than_its_rate_is_flagged():
    k = LinkTrack(8e6)
    link_window(k, 0.0, {"bytes": 0, "backlog": 0, "drops": 0, "rate_bps": 8e6})
    link_window(k, 0.5, {"bytes": 1_000_000 + BUCKET_SLACK, "backlog": 0, "drops": 0, "rate_bps": 8e6})  # 16 Mbit/s
    link_window(k, 0.55, {"bytes": 1_100_000, "backlog": 0, "drops": 0, "rate_bps": 8e6})  # too short to judge
    assert k.peak_bps == 16e6
    slow = LinkTrack(0.35e6)   # a slow link: its bucket is a quarter of a window's worth, and no excess
    link_window(slow, 0.0, {"bytes": 0, "backlog": 0, "drops": 0, "rate_bps": 0.35e6})
    link_window(slow, 0.25, {"bytes": 12_250, "backlog": 0, "drops": 0, "rate_bps": 0.35e6})
    assert slow.peak_bps < 0.35e6
    s = Samples(seconds=1.0)
    s.links["x.up"] = k
    assert judge(s)["why"] == ["link x.up carried 16 Mbit/s in a window, over the scenario's rate of 8"]


def test_the_dashboard_says_when_the_testbed_stopped_being_faithful():
    from dtemu.host.dashboard_render import render
    from dtemu.host.dashboard_state import DashboardState
    from rich.console import Console

    state = DashboardState(load_scenario("scenarios/fl_straggler.yaml").node_names)
    state.observe({"kind": "testbed", "faithful": False, "why": ["machine client1 received 30% less CPU"]})
    assert state.testbed_why == ["machine client1 received 30% less CPU"] and "testbed" not in state.nodes
    console = Console(record=True, width=160)
    console.print(render(state))
    assert "testbed NOT faithful: machine client1 received 30% less CPU" in console.export_text()
    state.observe({"kind": "testbed", "faithful": True, "why": []})
    assert state.testbed_why == []


def test_the_plan_says_when_emu_shares_a_machine_among_nodes():
    assert M.plan(load_scenario("scenarios/fl_straggler.yaml"), 2).emu_sets == []
    assert M.plan(load_scenario("scenarios/geo_hips.yaml"), 2).emu_sets == ["compute.machines=sites"]
    # and which machines hold several nodes, whose LAN the testbed does not run (emu validate says so)
    assert M.plan(load_scenario("scenarios/fl_straggler.yaml"), 2).shared == []
    assert M.plan(load_scenario("scenarios/geo_hips.yaml"), 2).shared == ["central", "a", "b"]
