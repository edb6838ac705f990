"""``emu run SCENARIO [--set k=v]... [--out DIR] [--no-tui] [--key-file F] [--jobs N] [--executor local|ray]
[--address A]``, ``emu report``, ``emu audit``.

Exit codes: 0 done; 2 the scenario or a file it names is invalid (nothing is
started, no run folder is made); 3 the run stopped on a dtemu error (a barrier
timeout, a bad checkpoint, missing data; its summary.json says why); 130
interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dtemu.core.errors import AppError, DtemuError, KeyFileError, ScenarioError
from dtemu.host.keys import load_key
from dtemu.host import cores, heap
from dtemu.host.exiting import exit_now
from dtemu.host.scenario_file import check_code, load_scenario, read_init
from dtemu.host.verbs import plug

from . import calibrate, sweep, validate

DATA_HELP = ("Data: the MNIST / Fashion-MNIST archives are looked up under the scenario's data.root, "
             "else $DTEMU_DATA, else ~/.cache/dtemu (layout <root>/MNIST/raw/*.gz); missing ones are "
             "downloaded. Without internet, point DTEMU_DATA (or data.root) at a folder holding them.")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emu", description="Run a dtemu scenario in the SimPy emulator.",
                                epilog=DATA_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario in virtual time", epilog=DATA_HELP)
    run.add_argument("scenario", nargs="?", help="scenario YAML file (or --flower-app DIR)")
    run.add_argument("--flower-app", metavar="DIR",
                     help="a Flower app folder (its pyproject.toml names the ServerApp and ClientApp) to run without a scenario "
                          "file: one is written for it (runs/<app>.yaml) with dtemu's defaults, and the run says "
                          "which keys to change next" "; its calls' costs are timed here first, in one short round")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario value, e.g. --set fl.codec=q8 (repeatable)")
    run.add_argument("--out", help="run folder (default: runs/<name>-<date>-<time>)")
    run.add_argument("--no-tui", action="store_true", help="no live dashboard")
    run.add_argument("--no-code", action="store_true",
                     help="refuse a scenario that names code (model or data.factory as package.module:factory), "
                          "before any of it is imported: for scenario files from elsewhere")
    run.add_argument("--profile", metavar="FILE",
                     help="apply a calibration profile (emu calibrate): this machine's costs, before --set")
    run.add_argument("--key-file", help="shared key that seals every message (HMAC-SHA256); "
                                        "default: $DTEMU_KEY_FILE, else $DTEMU_KEY, else none")
    run.add_argument("--jobs", type=int, default=None, metavar="N",
                     help="worker processes that train at the same time, for the same result: an FL round's "
                          "clients (default: as many as the cores hold at the scenario's threads each), a ddp "
                          "or geo step's workers (default 1); 1: in this process, one after another")
    run.add_argument("--executor", choices=("local", "ray"), default="local",
                     help="local: a process pool on this machine; ray: Ray tasks (pip install 'dtemu[ray]')")
    run.add_argument("--address", help="--executor ray: the Ray cluster to join (default: a local Ray)")
    plug(sub, "emu")  # report, audit, soak (host.verbs)
    sweep.add_parser(sub)
    calibrate.add_parser(sub)
    validate.add_parser(sub)
    return p


EXIT_APP = 6  # the user's app raised (a Flower ServerApp): the same code as real's


def default_out(name: str) -> Path:
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "plugged", None):
        return args.plugged(args)
    if args.command == "sweep":
        return sweep.main(args)
    if args.command == "calibrate":
        return calibrate.main(args)
    if args.command == "validate":
        return validate.main(args)
    if (args.scenario is None) == (args.flower_app is None):
        print("emu: run takes a scenario file or --flower-app DIR (one of them)", file=sys.stderr)
        return 2
    try:
        # (a run's heap churns with its messages and jobs: kept, they stop faulting their buffers in)
        heap.keep()
        if args.flower_app:
            args.scenario = _flower_app_scenario(args)
        scenario = load_scenario(args.scenario, args.overrides, allow_code=not args.no_code, profile=args.profile)
        # as many workers as the cores hold at the scenario's threads (more would only share them), where
        # the mode gains by it without being asked (core.modes: FL's clients, yes; ddp's gradients, not)
        jobs = args.jobs or (cores.fitting(scenario.threads) if scenario.kind.pool_by_default else 1)
        if jobs > 1 and args.executor == "local":
            from .fork_server import prestart

            # the workers' torch loads while this process loads its own, and the scenario's code's
            prestart(jobs, scenario.threads, scenario.kind.worker_modules)
        init = read_init(scenario)
        key, _ = load_key(args.key_file)
        check_code(scenario)  # code the scenario names that fails is refused before a run folder exists
    except (ScenarioError, KeyFileError) as err:
        print(f"emu: {err}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else default_out(scenario.name)

    from dtemu.host.dashboard import Dashboard  # rich is slow to import; only when running

    from .run import run_emulation

    dashboard = Dashboard(scenario, title=f"emu · {scenario.name}",
                          enabled=not args.no_tui and sys.stdout.isatty())
    try:
        with dashboard:
            summary = run_emulation(scenario, out, init=init, observers=[dashboard.observe], key=key,
                                    jobs=jobs, executor=args.executor,
                                    address=args.address)
    except KeyboardInterrupt:
        print(f"emu: interrupted; partial run in {out}", file=sys.stderr)
        return 130
    except ScenarioError as err:  # found only once the run is built (a model factory that is no model)
        print(f"emu: {err}", file=sys.stderr)
        return 2
    except AppError as err:  # the user's app ended the run (its traceback: in the run folder)
        print(f"emu: {err}", file=sys.stderr)
        return EXIT_APP
    except DtemuError as err:
        print(f"emu: {type(err).__name__}: {err}", file=sys.stderr)
        return 3
    acc = summary["final_accuracy"]
    progress = scenario.kind.progress(summary)
    print(
        f"{scenario.name}: {progress}, "
        f"accuracy {'n/a' if acc is None else f'{acc:.4f}'}, "
        f"up {summary['bytes_up'] / 1e6:.2f} MB, down {summary['bytes_down'] / 1e6:.2f} MB, "
        f"sim {summary['time_s']:.2f} s, wall {summary['wall_time_s']:.1f} s -> {out}"
    )
    if args.flower_app:
        from dtemu.host.flower_scenario import next_steps

        print(next_steps(Path(args.scenario), calibrated=not args.profile))
    return 0


def _flower_app_scenario(args) -> str:
    """The scenario file ``--flower-app`` runs: written for the app, with its calls' costs timed on this
    machine in one short round (emu.costs.flower_sets) unless a profile gives them."""
    from dtemu.host.flower_scenario import scenario_for

    into = Path(args.out).parent if args.out else Path("runs")
    path = scenario_for(args.flower_app, into)
    if args.profile:
        return str(path)
    from .costs import flower_sets

    print(f"emu: timing {args.flower_app}'s calls on this machine (one short round) ...", file=sys.stderr, flush=True)
    costs = flower_sets(load_scenario(path, args.overrides, allow_code=not args.no_code))
    return str(scenario_for(args.flower_app, into, costs))


def entry() -> None:
    """The ``emu`` command: ``main``, then an exit that skips tearing torch's modules down
    (host.exiting: 0.4-0.8 s a process)."""
    exit_now(main())


if __name__ == "__main__":
    entry()
