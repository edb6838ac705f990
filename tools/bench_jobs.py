"""`emu run`'s default ``--jobs`` against ``--jobs 1``: wall time and model, per scenario.

    python -m tools.bench_jobs [scenarios/fl_straggler.yaml ...] [--jobs default,1] [--repeat 1]
                               [--set KEY=VALUE ...]

Runs each scenario (default: every shipped one whose clients train in the pool,
mode fl) as a user would, ``emu run SCENARIO --no-tui``, alternating the
``--jobs`` settings named (default: the default ``--jobs`` and ``--jobs 1``; a ddp or geo
scenario: ``--jobs 1,2``), each in a fresh interpreter, and prints
their wall times (the summary's ``wall_time_s``, and the process's own) and
``model_sha256``.  Other load on the box only slows a run down.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FL = ["fl_straggler", "fl_faults", "fl_codecs", "fl_1000"]


def one(scenario: str, jobs: int | None, sets: list[str]) -> tuple[float, float, str, object]:
    """(process wall s, summary wall s, model sha256, executor) of one `emu run`."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "dtemu.emu.cli", "run", scenario, "--no-tui", "--out", f"{tmp}/run"]
        cmd += [] if jobs is None else ["--jobs", str(jobs)]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        summary = json.loads(Path(f"{tmp}/run/summary.json").read_text())
    return wall, summary["wall_time_s"], summary["model_sha256"], summary.get("emu", {}).get("executor")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenarios", nargs="*", default=[str(ROOT / "scenarios" / f"{n}.yaml") for n in FL])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--jobs", default="default,1", help="comma-separated: 'default' or a count")
    p.add_argument("--set", dest="sets", action="append", default=[])
    args = p.parse_args(argv)
    print("| scenario | --jobs | wall s (process) | wall s (summary) | executor | model_sha256 |\n|---|---|---:|---:|---|---|")
    for scenario in args.scenarios:
        for _ in range(args.repeat):
            for jobs in [None if j == "default" else int(j) for j in args.jobs.split(",")]:
                wall, inner, sha, executor = one(scenario, jobs, args.sets)
                label = "default" if jobs is None else str(jobs)
                pool = "in-process" if executor is None else f"{executor['kind']} x{executor['jobs']}"
                print(f"| {Path(scenario).stem} | {label} | {wall:.1f} | {inner:.1f} | {pool} | `{sha[:12]}` |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
