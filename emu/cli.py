"""``emu run SCENARIO [--set k=v]... [--out DIR] [--no-tui] [--key-file F]``

Exit codes: 0 done; 2 the scenario or a file it names is invalid; 3 the run
stopped on a dtemu error (a barrier timeout, a bad checkpoint, missing data);
130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dtemu.core.wire.auth import load_key
from dtemu.core.errors import DtemuError, KeyFileError, ScenarioError
from dtemu.core.scenario import load_scenario


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emu", description="Run a dtemu scenario in the SimPy emulator.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario in virtual time")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario value, e.g. --set fl.codec=q8 (repeatable)")
    run.add_argument("--out", help="run folder (default: runs/<name>-<date>-<time>)")
    run.add_argument("--no-tui", action="store_true", help="no live dashboard")
    run.add_argument("--key-file", help="shared key that seals every FL message (HMAC-SHA256); "
                                        "default: $DTEMU_KEY_FILE, else $DTEMU_KEY, else none")
    return p


def default_out(name: str) -> Path:
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def read_init(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise ScenarioError("fl.init_path", f"cannot read checkpoint {path}: {err.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        scenario = load_scenario(args.scenario, args.overrides)
        init = read_init(scenario.fl.init_path)
        key, _ = load_key(args.key_file)
    except (ScenarioError, KeyFileError) as err:
        print(f"emu: {err}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else default_out(scenario.name)

    from dtemu.host.dashboard import Dashboard  # rich is slow to import; only when running
    from dtemu.emu.run import run_emulation

    dashboard = Dashboard(scenario, title=f"emu · {scenario.name}",
                          enabled=not args.no_tui and sys.stdout.isatty())
    try:
        with dashboard:
            summary = run_emulation(scenario, out, init=init, observers=[dashboard.observe], key=key)
    except KeyboardInterrupt:
        print(f"emu: interrupted; partial run in {out}", file=sys.stderr)
        return 130
    except DtemuError as err:
        print(f"emu: {type(err).__name__}: {err}", file=sys.stderr)
        return 3
    acc = summary["final_accuracy"]
    progress = (f"{summary['steps']} steps" if scenario.mode == "ddp"
                else f"{summary['rounds']} rounds ({summary['rounds_failed']} failed)")
    print(
        f"{scenario.name}: {progress}, "
        f"accuracy {'n/a' if acc is None else f'{acc:.4f}'}, "
        f"up {summary['bytes_up'] / 1e6:.2f} MB, down {summary['bytes_down'] / 1e6:.2f} MB, "
        f"sim {summary['time_s']:.2f} s, wall {summary['wall_time_s']:.1f} s -> {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
