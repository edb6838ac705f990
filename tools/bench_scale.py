"""Thousands of clients (issue 12): wall time, memory, start-up, parallel speed-up, overhead.

    python -m tools.bench_scale run scenarios/fl_1000.yaml --jobs 2 [--set k=v ...]
        one `emu run` in a child process: wall time, peak memory of the whole process tree
        (PSS: shared pages, as the data set the workers share, count once; and RSS of the
        emulator alone), start-up (until the first round starts), model_sha256 and the
        sha256 of events.jsonl (to compare runs)
    python -m tools.bench_scale overhead scenarios/fl_1000.yaml [--set k=v ...]
        one serial run in this process, timing what is training (the clients' jobs) and
        what is evaluation: the rest of the wall time is the emulator's own overhead
    python -m tools.bench_scale ceiling scenarios/fl_1000.yaml [--jobs 300]
        the cores' ceiling for --jobs 2: two bare processes, each training --jobs jobs of
        the scenario's size (60 samples, its epochs and batch) one after another, side by
        side, against one alone

Results go to docs/notebook/ ("Thousands of clients (issue 12)").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        todo += [int(c) for c in children]
    return out


def _kb(path: str, field: str) -> int:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(args) -> dict:
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-scale-"))
    cmd = [sys.executable, "-m", "dtemu.emu.cli", "run", args.scenario, "--no-tui", "--out", str(out),
           "--jobs", str(args.jobs)]
    for o in args.set:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_pss = peak_rss = 0
    startup = None
    events = out / "events.jsonl"
    polls = seen = 0
    while proc.poll() is None:
        # RSS is cheap to read; PSS (smaps_rollup) costs this process real CPU, which a
        # speed-up measurement on two cores cannot spare: read it every 10th poll only.
        peak_rss = max(peak_rss, _kb(f"/proc/{proc.pid}/status", "VmRSS"))
        if polls % 10 == 0:
            pids = _tree(proc.pid)
            peak_pss = max(peak_pss, sum(_kb(f"/proc/{p}/smaps_rollup", "Pss") for p in pids))
        if startup is None and events.exists():
            with open(events, "rb") as f:  # only what was written since the last look
                f.seek(seen)
                chunk = f.read()
                seen += len(chunk)
                if b'"round_start"' in chunk:
                    startup = time.perf_counter() - t0
        polls += 1
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    text = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"emu run failed ({proc.returncode}):\n{text}")
    summary = json.loads((out / "summary.json").read_text())
    return {
        "scenario": args.scenario, "set": args.set, "jobs": args.jobs, "wall_s": round(wall, 1),
        "startup_s": None if startup is None else round(startup, 1),
        "peak_pss_mb": round(peak_pss / 1024), "peak_rss_emulator_mb": round(peak_rss / 1024),
        "model_sha256": summary["model_sha256"], "final_accuracy": summary["final_accuracy"],
        "rounds": summary.get("rounds"), "time_s": summary["time_s"], "bytes_down": summary["bytes_down"],
        "wire_bytes": summary["emu"]["wire_bytes"], "executor": summary["emu"].get("executor"),
        "run_wall_s": summary["wall_time_s"],
        "events_sha256": hashlib.sha256(events.read_bytes()).hexdigest(), "out": str(out),
    }


def overhead(args) -> dict:
    import torch

    from dtemu.core.ml.workload import Workload
    from dtemu.emu.run import run_emulation
    from dtemu.host.datasets import load_for
    from dtemu.host.scenario_file import load_scenario

    t0 = time.perf_counter()
    scenario = load_scenario(args.scenario, args.set)
    torch.set_num_threads(scenario.threads)
    work = Workload(scenario, load_for(scenario))
    work.partitions  # noqa: B018  (computed now, counted as start-up)
    spent = {"train": 0.0, "eval": 0.0}

    def timed(fn, what):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[what] += time.perf_counter() - t
        return wrapper

    work.run_job = timed(work.run_job, "train")
    work.evaluate = timed(work.evaluate, "eval")
    loaded = time.perf_counter()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-overhead-"))
    summary = run_emulation(scenario, out, work=work, jobs=1)
    end = time.perf_counter()
    run_wall = end - loaded
    rest = run_wall - spent["train"] - spent["eval"]
    return {"scenario": args.scenario, "set": args.set, "load_s": round(loaded - t0, 2),
            "run_wall_s": round(run_wall, 2), "train_s": round(spent["train"], 2), "eval_s": round(spent["eval"], 2),
            "overhead_s": round(rest, 2), "overhead_share": round(rest / run_wall, 4),
            "model_sha256": summary["model_sha256"]}


def _train_loop(scenario_path: str, n: int) -> float:
    """Seconds one process takes for ``n`` client jobs of the scenario's size (after one warm-up)."""
    import numpy as np
    import torch

    from dtemu.core.ml.jobs import TrainJob, run_train_job
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import flatten
    from dtemu.host.datasets import load_for
    from dtemu.host.scenario_file import load_scenario

    sc = load_scenario(scenario_path)
    torch.set_num_threads(sc.threads)
    data, model = load_for(sc), build_model(sc.model, seed=sc.seed)
    weights, rng = flatten(model), np.random.default_rng(0)
    jobs = [TrainJob(sc.model, sc.seed, weights, rng.integers(0, len(data.y_train), 60), sc.fl.epochs,
                     sc.fl.batch_size, sc.fl.lr, sc.fl.momentum, 0.0, i) for i in range(n + 1)]
    run_train_job(jobs[0], data, model)
    t = time.perf_counter()
    for job in jobs[1:]:
        run_train_job(job, data, model)
    return time.perf_counter() - t


def ceiling(args) -> dict:
    me = [sys.executable, "-m", "tools.bench_scale", "_loop", args.scenario, "--jobs", str(args.jobs)]
    alone = float(subprocess.run(me, capture_output=True, text=True, check=True).stdout)
    procs = [subprocess.Popen(me, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    pair = [float(p.communicate()[0]) for p in procs]
    return {"scenario": args.scenario, "jobs_each": args.jobs, "alone_s": round(alone, 2),
            "side_by_side_s": [round(x, 2) for x in pair], "ceiling": round(2 * alone / max(pair), 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("run", "overhead", "ceiling", "_loop"))
    p.add_argument("scenario")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--out")
    args = p.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.what == "_loop":  # one side of ``ceiling``
        print(_train_loop(args.scenario, args.jobs))
        return
    what = {"run": run, "overhead": overhead, "ceiling": ceiling}[args.what]
    print(json.dumps(what(args)))


if __name__ == "__main__":
    main()
