"""Run shipped scenarios in emu and print their results as tests/test_shipped_scenarios.py pins them.

    python -m tools.pin_scenarios [NAME ...] [--out DIR] [--json FILE]

One scenario at a time, in this process (the whole set takes about 1.5 hours on 2
cores).  Each line says whether the result is the pinned one; ``--json`` writes
every result with the arithmetic it ran with (``platform``: torch, numpy, CPU
kernels), so a pin that moved on a new host can be told apart from one that a
change moved.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from dtemu.emu.run import run_emulation
from dtemu.host.scenario_file import load_scenario
from dtemu.core.modes import MODES

ROOT = Path(__file__).resolve().parents[1]


def pinned() -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_shipped_scenarios import PINNED  # noqa: E402  (tests/ is not a package)
    return PINNED


def result_of(summary: dict, mode: str) -> tuple:
    unit = MODES[mode].unit + "s"   # rounds, or steps
    return (summary["model_sha256"], summary["final_accuracy"], summary[unit],
            summary["bytes_up"], summary["bytes_down"], summary["time_s"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="scenario names (default: every shipped one)")
    p.add_argument("--out", help="keep the run folders here (default: a temporary folder)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    pins = pinned()
    names = args.names or sorted(pins)
    out = Path(args.out or tempfile.mkdtemp(prefix="dtemu-pins-"))
    results, moved = [], 0
    for name in names:
        scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        t0 = time.perf_counter()
        summary = run_emulation(scenario, out / name)
        got = result_of(summary, scenario.mode)
        same = name in pins and got[:5] == tuple(pins[name][:5]) and abs(got[5] - pins[name][5]) < 1e-9
        moved += not same
        print(f"{name}: {'same as the pin' if same else 'MOVED'} ({time.perf_counter() - t0:.0f} s)", flush=True)
        print(f'    "{name}": {got!r},', flush=True)
        results.append({"name": name, "result": list(got), "pinned": list(pins.get(name, ())), "same": same,
                        "platform": summary.get("platform", {}), "wall_s": round(time.perf_counter() - t0, 1)})
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
