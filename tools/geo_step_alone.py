"""A geo worker's gradient pass as the worker runs it (``round_batch``, ``Workload.gradients``), in two
processes sharing one CPU group, as a site's two workers share their testbed machine, without DDS or
a PS beside them: each round's time, back to back or with GAP seconds between rounds (root).

    sudo python -m tools.geo_step_alone GAP SHARE        # e.g. 0 0.533, then 0.3 0.533

Notebook entry 34 compares it with the testbed's geo_step events and emu's calibrated step.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

SCENARIO = "scenarios/geo_bisparse_fp16.yaml"
ROUNDS = 12


def _worker(index: int, gap: float, group, barrier, results) -> None:
    import torch

    from dtemu.core.geo.common import round_batch
    from dtemu.core.ml.workload import Workload
    from dtemu.host.datasets import load_for
    from dtemu.host.scenario_file import load_scenario

    torch.set_num_threads(1)
    group.join()
    scenario = load_scenario(SCENARIO, ["threads=1"])
    work = Workload(scenario, load_for(scenario))
    model = work.new_model()
    times = []
    barrier.wait()
    for r in range(1, ROUNDS + 1):
        batch = round_batch(work, scenario, index, r)
        t0 = time.perf_counter()
        work.gradients(model, batch, index, r)
        times.append(round(time.perf_counter() - t0, 3))
        time.sleep(gap)
    results.put((index, times))


def main(argv: list[str]) -> int:
    from dtemu.host.cpu_shares import CpuGroup

    gap, share = float(argv[0]), float(argv[1])
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ctx = mp.get_context("spawn")
    group = CpuGroup(f"dtm{os.getpid()}-geostep", share).create()
    try:
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(i, gap, group, barrier, results)) for i in range(2)]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=300) for _ in procs)
        for p in procs:
            p.join()
    finally:
        group.remove()
    for index, times in got:
        print(f"gap {gap:g} s, share {share:g}, worker {index}: {times}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
