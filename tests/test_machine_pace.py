"""host.machine_pace: a machine's steps and cost from the processes that shared it, whichever of
them its quota favoured."""

import pytest

from dtemu.host.machine_pace import machine_cost, machine_steps
from dtemu.host.train_cost import spread_parts


def test_a_process_alone_on_its_machine_keeps_its_own_steps():
    steps = [0.1, 0.12, 0.09, 0.11]
    assert machine_steps([(0, steps), (1, [0.2, 0.2])]) == [steps, [0.2, 0.2]]


def test_an_unfair_share_of_a_steady_machine_is_a_steady_pace():
    """A machine that does 3 steps a 0.3 s, given to one process twice as often as to the other two
    while all three run (half its time, then a quarter each): that one steps in 0.2 s, the others in
    0.4 s; the machine does three steps every 0.3 s until the first is done."""
    fast, slow = [0.2] * 12, [0.4] * 12
    pace = machine_steps([(0, fast), (0, slow), (0, slow)])[0]
    assert pace[:8] == pytest.approx([0.3] * 8)
    # taken one by one, the same processes vary by half a step
    assert spread_parts([fast, slow, slow], batch=64)[0] > 0.3
    assert spread_parts([pace[:8]], batch=64) == pytest.approx((0.0, 0.0), abs=1e-9)


def test_steps_out_of_step_are_counted_in_fractions():
    """Two processes whose steps end apart (one's fast when the other's is slow): the machine does
    two steps every 0.2 s, though neither process ends a step when the machine does."""
    a, b = [0.15, 0.25] * 5, [0.25, 0.15] * 5
    assert machine_steps([(0, a), (0, b)])[0] == pytest.approx([0.2] * 10)


def test_fewer_processes_left_step_at_their_own_pace():
    """Once one of two is done, the other's steps are the machine's (a machine is timed while its
    work lasts): two steps of 0.1 then one of 0.2, each a step of both."""
    pace = machine_steps([(0, [0.1, 0.1]), (0, [0.1, 0.1, 0.1, 0.1])])[0]
    assert pace == pytest.approx([0.1, 0.1, 0.2])


def test_a_machines_cost_is_its_slowest_process():
    assert machine_cost([(0, 2.0), (0, 3.0), (1, 1.0), (0, 2.5)]) == [3.0, 1.0]
