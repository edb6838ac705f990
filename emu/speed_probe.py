"""The host's own speed, probed between the runs of ``emu validate``: did the box stay the machine it
was calibrated as?

A virtual machine's speed moves with its neighbours, and no quota, steal counter or link monitor sees
it: the hypervisor gives the cores, and each runs slower (a busy host's shared caches, memory bandwidth,
clock).  Measured here (docs/notebook/ entry 37): FL's q8 row trained 12% slower on the testbed in one
table than in the one before under the same calibration, and 20% faster again hours later; steal was
1-3% throughout.  Emu predicts the machine its calibration timed, so a run on a box that moved away
from it compares two machines, not emu and the testbed.

``probe`` times a fixed workload of its own (one thread: small matrix products, then a copy through
32 MB), nothing of the scenario's, so that it is the same yardstick for every row: the median of
``REPS`` timings of each half, about 0.3 s in all.  Back to back here, its compute half moved by up to
1.5% and its memory half by up to 5%.  ``moved`` says how far a later probe is from the calibration's;
emu validate probes after calibrating and after each run, so each run is bracketed by two probes, and
records the moves with a warning past ``LIMITS`` (emu.fidelity.note_host).  It does not judge the
testbed by them: in the first table that did (notebook entry 37), the probe moved by up to 18% and 20%
a minute apart while the runs' rounds moved by 3-7%, in the same direction.  Until its moves are
known to say how much a run moved, a limit on them would throw good runs away.
"""

from __future__ import annotations

import statistics
import time

REPS = 7
LIMITS = {"compute": 0.05, "memory": 0.10}   # over each half's own noise (1.5% and 5% back to back)


def probe() -> dict[str, float]:
    """{"compute": s, "memory": s}: the median seconds of each half of the fixed workload."""
    import numpy as np
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(192, 192, generator=gen)
        src = np.ones(8 << 20, np.float32)
        dst = np.empty_like(src)
        times = []
        for _ in range(REPS + 1):   # (the first warms both)
            t0 = time.perf_counter()
            for _ in range(150):
                a @ a
            t1 = time.perf_counter()
            for _ in range(6):
                np.copyto(dst, src)
            times.append((t1 - t0, time.perf_counter() - t1))
        times = times[1:]
        return {"compute": round(statistics.median(t for t, _ in times), 6),
                "memory": round(statistics.median(m for _, m in times), 6)}
    finally:
        torch.set_num_threads(threads)


def moved(reference: dict, later: dict) -> dict[str, float]:
    """How much longer (positive: slower) each half took in ``later`` than in ``reference``."""
    return {k: round(later[k] / reference[k] - 1.0, 4) for k in LIMITS if reference.get(k) and later.get(k)}


def past_limits(moves: dict[str, float]) -> list[str]:
    """Each half that moved past its limit, in words (empty: the host stayed the calibrated one)."""
    return [f"the host's {k} probe took {100 * v:+.1f}% more time than at the calibration (limit "
            f"{100 * LIMITS[k]:.0f}%)" for k, v in sorted(moves.items()) if abs(v) > LIMITS[k]]
