"""``real run SCENARIO --rank N`` and ``real launch SCENARIO``: scenarios for real over CycloneDDS.

FL: rank 0 is the controller, ranks 1..N the clients.  DDP: ranks 0..W-1 are
the workers.  ``real launch`` starts every rank on this machine (loopback),
shows one dashboard for all of them and gathers their run folders into one.

Exit codes: 0 done; 2 invalid scenario or arguments; 3 the run stopped on a
dtemu error (barrier or collective timeout, bad checkpoint, missing data);
4 DDS failed; 5 stopped: a peer was lost (DDP, ddp.on_worker_lost; summary.json
has stop_reason and lost_ranks); 100+i crashed at faults.crashes[i] (fault injection; `real launch`
restarts it if the fault says so); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from dtemu.host.exiting import exit_now
from dtemu.host.keys import load_key
from dtemu.core.errors import AppError, DtemuError, KeyFileError, ScenarioError
from dtemu.core.scenario import CONTROLLER, stretched
from dtemu.host.scenario_file import check_code, load_scenario, read_init
from dtemu.host.verbs import plug
from dtemu.real import rogue

EXIT_OK, EXIT_USAGE, EXIT_RUN, EXIT_DDS, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 2, 3, 4, 130, 143
EXIT_PEER_LOST = 5
EXIT_APP = 6  # the user's app raised (a Flower ServerApp): its traceback is in the run folder


class Terminated(BaseException):
    """SIGTERM: stop like Ctrl-C (transport closed, run folder kept), exit 143.

    A BaseException, as KeyboardInterrupt is: the signal may land inside code that
    survives its own errors (``except Exception`` around a DDS call), which must not
    swallow it (it did, and the rank ran on to its barrier timeout)."""


def _on_sigterm(signum, frame):
    raise Terminated()


NO_CODE_HELP = ("refuse a scenario that names code (model or data.factory as package.module:factory), "
                "before any of it is imported: for scenario files from elsewhere")
DATA_HELP = ("Data: the MNIST / Fashion-MNIST archives are looked up under the scenario's data.root, "
             "else $DTEMU_DATA, else ~/.cache/dtemu (layout <root>/MNIST/raw/*.gz); missing ones are "
             "downloaded. Without internet, point DTEMU_DATA (or data.root) at a folder holding them.")


def _common(p: argparse.ArgumentParser, out_default: str) -> None:
    p.add_argument("scenario", nargs="?", help="scenario YAML file (or, for launch, --flower-app DIR)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value (repeatable)")
    p.add_argument("--out", help=f"run folder (default: {out_default})")
    p.add_argument("--no-tui", action="store_true", help="no live dashboard")
    p.add_argument("--no-code", action="store_true",
                   help=NO_CODE_HELP)
    p.add_argument("--domain", type=int, default=None, help="DDS domain id (default $DTEMU_DDS_DOMAIN or 0)")
    p.add_argument("--profile", default="loopback", choices=["loopback", "lan"],
                   help="CycloneDDS profile (lan: peers from --peers or $DTEMU_DDS_PEERS)")
    p.add_argument("--peers", default=None, help="comma-separated peer addresses for the lan profile")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the scenario's)")
    p.add_argument("--time-scale", type=float, default=None, metavar="X",
                   help="stretch every duration of the scenario (timeouts, fault times) X times; "
                        "real launch's default measures this machine against the scenario's compute model "
                        "(real/calibrate.py), real run's is 1; --time-scale 1 turns it off")
    p.add_argument("--key-file", help="shared key that seals every message (HMAC-SHA256); "
                                      "default: $DTEMU_KEY_FILE, else $DTEMU_KEY, else none")
    p.add_argument("--links", choices=("scenario", "latency", "machine"), default=None,
                   help="scenario: each message takes the time the scenario's links give it, stretched by the "
                        "time scale (real/paced_links.py); latency: the network's rates, and each message held "
                        "for the scenario's latency (a testbed without netem: real launch --machines); machine: "
                        "the time this machine's network takes. Default: scenario under a time scale on the "
                        "loopback profile (one machine playing several), else machine")


def paced_links(args, pace: float | None) -> str | None:
    """How this rank's messages take the scenario's links' time (``--links``, else its default):
    "scenario" (rates and latency), "latency" (latency alone), or None (the network's own time)."""
    if args.links is not None:
        return None if args.links == "machine" else args.links
    return "scenario" if args.profile == "loopback" and pace is not None else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="real", description="Run a dtemu scenario for real over CycloneDDS.",
                                epilog=DATA_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one rank of a scenario", epilog=DATA_HELP)
    _common(run, "runs/<name>-real-<date>-<time>/rank<N>")
    run.add_argument("--rank", type=int, default=None,
                     help="which rank this process runs: FL, 0 is the controller and 1..N the clients; "
                          "DDP, 0..W-1 are the workers. Default: from torchrun's environment (RANK, WORLD_SIZE, "
                          "MASTER_ADDR: the peers meet at its store) or SLURM's (SLURM_PROCID, SLURM_NTASKS, "
                          "SLURM_NODELIST), with the lan profile and those peers (real/cluster_env.py)")
    run.add_argument("--fired", default="", help=argparse.SUPPRESS)  # restarted by launch: crashes done
    run.add_argument("--append", action="store_true", help=argparse.SUPPRESS)  # restarted: keep events
    launch = sub.add_parser("launch", help="run every rank on this machine and gather the run folders",
                            epilog=DATA_HELP)
    _common(launch, "runs/<name>-real-<date>-<time>")
    launch.add_argument("--flower-app", metavar="DIR",
                        help="a Flower app folder (its pyproject.toml names the ServerApp and ClientApp) to run without a scenario "
                          "file: one is written for it (runs/<app>.yaml) with dtemu's defaults, and the run says "
                          "which keys to change next")
    launch.add_argument("--timeout", type=float, default=None, help="kill everything after this many seconds")
    launch.add_argument("--gpus", default=None, metavar="LIST",
                        help="device: cuda, one GPU a rank: comma-separated GPU indices; rank r's process sees "
                             "GPU LIST[r mod len(LIST)] alone (CUDA_VISIBLE_DEVICES)")
    launch.add_argument("--machines", choices=("netns",), default=None,
                        help="netns (root): every node (a site, where the scenario has sites) on a machine of its "
                             "own: a network namespace behind a link shaped to the scenario's and a CPU share, with "
                             "fidelity monitors (summary.json's testbed; real/machines.py)")
    launch.add_argument("--cpu-share", type=float, default=None, metavar="CPUS",
                        help="with --machines: each machine's CPU, in cores (default: 0.9 x this box's cores, split "
                             "evenly)")
    plug(sub, "real")  # report, audit, soak (host.verbs)
    rogue.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "plugged", None):
        return args.plugged(args)
    if args.command == "rogue":
        return rogue.main(args)
    app = getattr(args, "flower_app", None)
    if (args.scenario is None) == (app is None):
        print(f"real: {args.command} takes a scenario file" + (" or --flower-app DIR (one of them)" if args.command
                                                                 == "launch" else ""), file=sys.stderr)
        return EXIT_USAGE
    try:
        if app:
            from dtemu.host.flower_scenario import scenario_for

            args.scenario = str(scenario_for(app, Path(args.out).parent if args.out else Path("runs")))
        scenario = load_scenario(args.scenario, args.overrides, allow_code=not args.no_code)
        key, key_from = load_key(args.key_file)
        check_code(scenario)  # code the scenario names that fails is refused before any process starts
    except (ScenarioError, KeyFileError) as err:
        print(f"real: {err}", file=sys.stderr)
        return EXIT_USAGE
    args.key, args.key_from = key, key_from
    if args.command == "run" and args.time_scale not in (None, 1.0):
        scenario = stretched(scenario, args.time_scale)
    if args.command == "launch":
        try:  # the controller's checkpoint, checked before any process starts
            read_init(scenario)
        except ScenarioError as err:
            print(f"real: {err}", file=sys.stderr)
            return EXIT_USAGE
        from dtemu.real.launch import launch

        # SIGINT stops a launch (its ranks, then its machines), whoever sends it.  A launcher started
        # in the background of a script (`real launch ... &`, or under a test runner so started)
        # inherits SIGINT ignored, as POSIX has it, and Python then installs no handler: `kill -INT`
        # did nothing and the run went on to its end (notebook entry 47).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return launch(args, scenario)
    return run_rank(args, scenario)


def _place_from_launcher(args, ranks: int) -> int:
    """``--rank`` and ``--peers`` from torchrun's or SLURM's environment (0, or an exit code)."""
    from dtemu.real.cluster_env import ClusterEnvError, placement

    try:
        place = placement()
    except ClusterEnvError as err:
        print(f"real: {err}", file=sys.stderr)
        return EXIT_USAGE
    if place is None:
        print("real: run needs --rank, or the environment of torchrun (RANK, WORLD_SIZE, MASTER_ADDR) or "
              "SLURM (SLURM_PROCID, SLURM_NTASKS, SLURM_NODELIST)", file=sys.stderr)
        return EXIT_USAGE
    if place.world != ranks:
        print(f"real: {place.launcher} started {place.world} processes; the scenario has {ranks} ranks", file=sys.stderr)
        return EXIT_USAGE
    args.rank = place.rank
    if args.peers is None:
        args.peers, args.profile = ",".join(dict.fromkeys(place.peers)), "lan"
    if place.address and not os.environ.get("DTEMU_DDS_INTERFACE"):
        os.environ["DTEMU_DDS_INTERFACE"] = place.address
    return 0


def run_rank(args, scenario) -> int:
    from dtemu.host import heap

    heap.keep()   # before the rank allocates: its passes stop faulting their buffers in after each message
    names = scenario.node_names
    if args.rank is None:
        code = _place_from_launcher(args, len(names))
        if code:
            return code
    if not 0 <= args.rank < len(names):
        print(f"real: --rank {args.rank} is out of range: {scenario.name} has ranks 0..{len(names) - 1}",
              file=sys.stderr)
        return EXIT_USAGE
    name = names[args.rank]
    out = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-real-{time.strftime('%Y%m%d-%H%M%S')}" / f"rank{args.rank}"
    try:  # a restarted controller (real launch, --append) may resume from the last round's checkpoint
        init = read_init(scenario, resuming_a_crash=args.append) if name == CONTROLLER else None
    except ScenarioError as err:
        print(f"real: {err}", file=sys.stderr)
        return EXIT_USAGE

    from cyclonedds.core import DDSException

    from dtemu.host.dashboard import Dashboard

    from dtemu.real.node import run_node

    if scenario.faults.offline and not os.environ.get("DTEMU_LAUNCHED"):
        print("real: note: faults.offline windows are carried out by `real launch` (it kills and restarts "
              "ranks); a rank run alone ignores them", file=sys.stderr)
    if args.peers:
        os.environ["DTEMU_DDS_PEERS"] = args.peers
    dashboard = Dashboard(scenario, title=f"real · {scenario.name} · {name}",
                          enabled=not args.no_tui and sys.stdout.isatty())
    signal.signal(signal.SIGTERM, _on_sigterm)
    if os.environ.get("DTEMU_LAUNCHED"):
        # `real launch` stops its ranks with SIGINT.  A launcher started in the background of a
        # script hands its ranks SIGINT ignored (POSIX does so for `cmd &`), and Python then
        # installs no handler: the ranks would run on until killed, their folders unfinished.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    pace = args.time_scale if args.time_scale not in (None, 1.0) else None  # under a launch's time scale
    try:
        with dashboard:
            summary = run_node(scenario, args.rank, out, init=init, domain_id=args.domain, profile=args.profile,
                               threads=args.threads, observers=[dashboard.observe], key=args.key,
                               fired=[int(i) for i in args.fired.split(",") if i], append=args.append,
                               pace=pace, links=paced_links(args, pace))
    except KeyboardInterrupt:
        print(f"real: {name} interrupted; partial run in {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print(f"real: {name} terminated; partial run in {out}", file=sys.stderr)
        return EXIT_TERMINATED
    except AppError as err:
        print(f"real: {name}: {err}", file=sys.stderr)
        return EXIT_APP
    except DtemuError as err:
        print(f"real: {name}: {type(err).__name__}: {err}", file=sys.stderr)
        return EXIT_RUN
    except DDSException as err:
        print(f"real: {name}: DDS failed: {err}", file=sys.stderr)
        return EXIT_DDS
    stopped = scenario.kind.stopped_early(summary)
    if stopped:
        from dtemu.core.ddp.regroup import BARRIER_STOP

        # A peer missing at the start stays a barrier timeout (3); one lost mid-run is 5.
        print(f"real: {name} stopped: {stopped}; summary in {out}", file=sys.stderr)
        return EXIT_RUN if stopped.startswith(BARRIER_STOP) else EXIT_PEER_LOST
    print(f"{scenario.name} [{name}]: " + ", ".join(f"{k} {v}" for k, v in summary.items()
                                                   if k in ("final_accuracy", "rounds", "steps", "wall_time_s")))
    return EXIT_OK


def entry() -> None:
    """The ``real`` command: ``main``, then an exit that skips tearing torch's modules down
    (host.exiting: 0.4-0.8 s a process)."""
    exit_now(main())


if __name__ == "__main__":
    entry()
