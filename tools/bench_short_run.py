"""emu's overhead on a short run: `emu run --jobs N` against the same clients' training alone on N processes.

    python -m tools.bench_short_run [SCENARIO] [--set KEY=VALUE ...] [--jobs 2] [--repeat 2]

Default: the issue's FedAvg workload, scenarios/fl_1000.yaml cut to 5 rounds of 1
epoch with one evaluation at the end (1000 Dirichlet MNIST clients, 100 drawn per
round, batch 16, the small CNN).  Each repeat measures both sides in fresh
processes, one after the other:

- **emu**: ``emu run SCENARIO --no-tui --jobs N`` as a user types it; its wall time
  from start to exit (imports, data, partitioning, the pool, the run, the folder),
  and the summary's ``wall_time_s`` (the run alone).
- **bare**: the clients' training alone.  N worker processes, started, with torch
  and the data set loaded and torch's one-off costs paid (``warm_up``); then, timed,
  they train the very clients emu's run trained (its ``train_start`` events) round
  by round from the averaged weights, and the parent evaluates once at the end on
  the same test samples.

Prints the best of ``--repeat`` for each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = str(ROOT / "scenarios" / "fl_1000.yaml")
DEFAULT_SETS = ["fl.rounds=5", "fl.epochs=1", "fl.eval_every=5"]

_work = None  # a bare worker's workload


def _init(scenario_path: str, sets: list[str], threads: int) -> None:
    global _work
    import torch

    from dtemu.core.ml.workload import Workload
    from dtemu.host.datasets import load_for
    from dtemu.host.scenario_file import load_scenario

    from dtemu.core.ml.train import warm_up

    torch.set_num_threads(threads)
    scenario = load_scenario(scenario_path, sets)
    _work = Workload(scenario, load_for(scenario))
    warm_up()


def _ready(_) -> None:
    time.sleep(0.5)  # long enough that every worker takes one: each has finished _init


def _train(args):
    weights, cmd, client = args
    new, _ = _work.run_job(_work.train_job(weights, cmd, client))
    return new


def bare(scenario_path: str, sets: list[str], jobs: int, trained: dict[int, list[int]]) -> float:
    """Seconds for ``trained`` (round -> clients) on ``jobs`` fresh worker processes, plus one evaluation."""
    import numpy as np

    from dtemu.core.ml.workload import Workload, round_seed
    from dtemu.core.wire.messages import TrainCmd
    from dtemu.host.datasets import load_for
    from dtemu.host.scenario_file import load_scenario

    scenario = load_scenario(scenario_path, sets)
    work = Workload(scenario, load_for(scenario))
    work.partitions  # noqa: B018  (before the clock, as emu's is part of its run)
    fl = scenario.fl
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(jobs, initializer=_init, initargs=(scenario_path, sets, scenario.threads)) as pool:
        pool.map(_ready, range(jobs), chunksize=1)
        t0 = time.perf_counter()
        weights = work.initial_weights
        for round_ in sorted(trained):
            cmd = TrainCmd(round_, fl.subset, fl.epochs, fl.lr, round_seed(scenario.seed, round_))
            results = pool.map(_train, [(weights, cmd, c) for c in trained[round_]], chunksize=1)
            weights = np.mean(results, axis=0, dtype=np.float32)
        work.evaluate(weights)
        return time.perf_counter() - t0


def emu(scenario_path: str, sets: list[str], jobs: int) -> tuple[float, float, dict[int, list[int]]]:
    """(process wall s, summary wall s, round -> the clients that trained) of one `emu run`."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "dtemu.emu.cli", "run", scenario_path, "--no-tui", "--jobs", str(jobs),
               "--out", f"{tmp}/run"] + [a for s in sets for a in ("--set", s)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        summary = json.loads(Path(f"{tmp}/run/summary.json").read_text())
        trained: dict[int, list[int]] = defaultdict(list)
        for line in Path(f"{tmp}/run/events.jsonl").read_text().splitlines():
            e = json.loads(line)
            if e["kind"] == "train_start":
                trained[e["round"]].append(int(e["node"].removeprefix("client")))
    return wall, summary["wall_time_s"], dict(trained)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", nargs="?", default=DEFAULT)
    p.add_argument("--set", dest="sets", action="append", default=None)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    sets = DEFAULT_SETS if args.sets is None and args.scenario == DEFAULT else (args.sets or [])
    emu_walls, emu_runs, bares = [], [], []
    for _ in range(args.repeat):
        wall, inner, trained = emu(args.scenario, sets, args.jobs)
        emu_walls.append(wall)
        emu_runs.append(inner)
        bares.append(bare(args.scenario, sets, args.jobs, trained))
        print(f"emu {wall:.2f} s (run {inner:.2f} s), bare {bares[-1]:.2f} s", flush=True)
    e, r, b = min(emu_walls), min(emu_runs), min(bares)
    print(f"{Path(args.scenario).stem} {' '.join(sets)}, --jobs {args.jobs}, best of {args.repeat}: "
          f"emu run {e:.2f} s (the run alone {r:.2f} s), bare {b:.2f} s: {e / b:.2f}x ({r / b:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
