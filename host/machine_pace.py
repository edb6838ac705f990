"""A machine's pace, from the steps of the processes that trained on it at once.

``emu calibrate`` times a testbed machine's training by running as many trainers in its CPU share
as the testbed puts there (host.train_cost.measured_together).  emu then shares the machine among
its jobs itself (emu.machines: processor sharing), so what it needs is the machine's: how long a
step of its work takes, and how much that varies.  One process's steps say neither where several
share a quota, because how the quota's periods fall among them moves time from one to another.
Three geo workers in one 0.533 share (notebook entry 50) took 7 to 12 s for the same 24 steps, and
their steps, taken one by one, varied by 0.49 of a step, while their machine did three steps every
0.44 s to within 3%: emu, given the 0.49, swung a site's round from 0.27 to 0.81 s.

A process's progress is counted in steps, a fraction of one while it is in it; the machine's
progress is the sum over its processes, and its k-th step ends when that sum reaches k times the
processes (the time one job takes at 1/n of the machine, as emu gives it).  With one process to a
machine these are the process's own steps, exactly.
"""

from __future__ import annotations

import bisect
import itertools


def machine_steps(runs: list[tuple[int, list[float]]]) -> list[list[float]]:
    """Each machine's steps (``_pace``) from ``runs``: (machine, one process's steps in order, timed
    from one start line)."""
    return [_pace(members) for members in _by_machine(runs).values()]


def machine_cost(runs: list[tuple[int, float]]) -> list[float]:
    """Each machine's seconds per sample of one process (``runs``: (machine, one process's seconds per
    sample over its steps)): its slowest process's, when all its processes' steps are done, which is
    the machine's time for them all whichever of them it favoured on the way."""
    return [max(costs) for costs in _by_machine(runs).values()]


def _by_machine(runs: list[tuple[int, object]]) -> dict[int, list]:
    out: dict[int, list] = {}
    for machine, value in runs:
        out.setdefault(machine, []).append(value)
    return out


def _pace(members: list[list[float]]) -> list[float]:
    """The machine's steps, each the time its processes took together for as many steps as there are
    of them (while fewer are left, their own pace: a machine is timed while its work lasts)."""
    if len(members) == 1:
        return list(members[0])
    ends = [[0.0, *itertools.accumulate(steps)] for steps in members]
    every = len(members)

    def done(t: float) -> float:   # the machine's progress, in steps, at time t
        total = 0.0
        for e in ends:
            i = bisect.bisect_right(e, t) - 1
            total += i if i >= len(e) - 1 else i + (t - e[i]) / max(e[i + 1] - e[i], 1e-12)
        return total

    # Progress is linear between the processes' step ends: each crossing is found within one such span.
    out, last, k = [], 0.0, 1
    before_t, before = 0.0, 0.0
    for t in sorted({t for e in ends for t in e[1:]}):
        now = done(t)
        while now >= k * every - 1e-9:
            at = before_t + (k * every - before) / max(now - before, 1e-12) * (t - before_t)
            out.append(min(at, t) - last)
            last, k = min(at, t), k + 1
        before_t, before = t, now
    return out
