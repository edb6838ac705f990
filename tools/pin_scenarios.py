"""Run shipped scenarios in emu and print their results as tests/pins.py pins them.

    python -m tools.pin_scenarios [NAME ...] [--fast] [--out DIR] [--json FILE]

One scenario at a time, in this process: whole, under this process's arithmetic
(about 1.5 hours on 2 cores for the set), or ``--fast``: cut short as
tests/pins.py's CUTS say, for the fast pins (run it under
``DTEMU_CPU_ARITH=exact``, as tests/test_fast_pins.py does; about a minute).
Each line says whether the result is the one pinned for this host class and
setting (``--fast``: under exact, for any host); ``--json`` writes every result with the
arithmetic it ran with (``platform``), so a pin that moved on a new host can be
told apart from one that a change moved.  Exit status 1 when any moved or has
no pin.
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

ROOT = Path(__file__).resolve().parents[1]


def pins_module():
    sys.path.insert(0, str(ROOT / "tests"))
    import pins  # noqa: E402  (tests/ is not a package)
    return pins


def result_of(summary: dict, unit: str) -> tuple:
    return (summary["model_sha256"], summary["final_accuracy"], summary[unit + "s"],
            summary["bytes_up"], summary["bytes_down"], summary["time_s"])


def same(got: tuple, pin: tuple | None) -> bool:
    return pin is not None and got[:5] == tuple(pin[:5]) and abs(got[5] - pin[5]) < 1e-9


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="scenario names (default: every shipped one)")
    p.add_argument("--fast", action="store_true", help="each scenario cut short (tests/pins.py's CUTS)")
    p.add_argument("--out", help="keep the run folders here (default: a temporary folder)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    pins = pins_module()
    from dtemu.host import cpu_arith

    table = pins.FAST if args.fast else pins.PINNED.get((cpu_arith.host_class(), cpu_arith.mode()), {})
    names = args.names or sorted(pins.CUTS)
    out = Path(args.out or tempfile.mkdtemp(prefix="dtemu-pins-"))
    results, moved = [], 0
    for name in names:
        scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml", pins.CUTS[name] if args.fast else ())
        t0 = time.perf_counter()
        summary = run_emulation(scenario, out / name)
        fp = summary["platform"]["fingerprint"]
        got = result_of(summary, scenario.kind.unit)
        pin = table.get(name)
        ok = same(got, pin)
        moved += not ok
        said = "same as the pin" if ok else ("MOVED" if pin else "no pin for this arithmetic")
        print(f"{name}: {said} (fingerprint {fp}, {time.perf_counter() - t0:.0f} s)", flush=True)
        print(f'    "{name}": {got!r},', flush=True)
        results.append({"name": name, "fast": args.fast, "result": list(got), "pinned": list(pin or ()), "same": ok,
                        "platform": summary["platform"], "wall_s": round(time.perf_counter() - t0, 1)})
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
