"""``emu validate``: how far emu's a-priori prediction of a scenario is from its run on the testbed.

    emu validate SCENARIO [--set KEY=VALUE]... [--out DIR] [--repeat N] [--cpu-share CPUS]

Root, as the testbed is (real launch --machines netns).  For any scenario of any mode, in this order:

1. **calibrate**: ``emu calibrate --together`` of the scenario in the testbed's CPU shares
   (core.runtime.machine_plan): every trainer at once, a machine's trainers in its one share, the
   step given per machine (emu shares a machine among its jobs itself).  Written to
   ``DIR/profile.yaml``; nothing in it comes from the run it predicts.
2. **predict**: ``emu run --profile`` into ``DIR/emu``, with the testbed's machines
   (``compute.machines: sites``: a site's nodes share their machine's CPU).  The profile carries real
   mode's transport (its framing, its writer history).  ``--draws N`` (default 5) more draws of the
   machines' variation (``compute.spread_draw`` 1..N-1, into ``DIR/emu-draw<k>``): a run's timing is
   one draw of it, and each unit is predicted as their mean (emu.fidelity), with their band.
3. **run**: ``real launch --machines netns --time-scale 1``, ``--repeat`` times, into
   ``DIR/real-<i>``: every node (or site) on a machine of its own at the scenario's link rates, and
   the fidelity monitors' verdict in its summary.
4. **compare**, unit by unit (emu.fidelity, the mode's units: round, step or version):
   ``DIR/validation.json`` holds one record per repetition with ``time_error`` and ``comm_error``
   ((emu - real) / real, fractions), ``same_model``, ``faithful`` and ``within_targets`` (the errors
   within the targets on a faithful testbed: an unfaithful one's result does not count), and the
   errors without the first compared unit (``without_first_unit``, a diagnosis: a warning says where
   only that unit misses); the table is printed.  A repetition whose monitors say its testbed was not faithful runs again, up to
   ``--retries`` times (its record lists what each unfaithful attempt measured, and its folder stays
   as ``real-<i>-unfaithful-<k>``).  The host's own speed is probed after calibrating and after each
   run (emu.speed_probe), and each record holds the moves around its run (``host_moved``), with a
   warning past the probe's limits: recorded, not yet judged.  With ``--host-speed each`` (the
   default), every run, the first too, is predicted just before it: the calibration's step is timed
   again as calibrated, and its prices scaled by how far the step moved (``DIR/profile-<i>.yaml``,
   ``DIR/emu-<i>``; ``host_factor`` in its record), as the host's speed drifts by 10% or more within
   an hour of the same work, and a calibration takes minutes.

Exit 0 whether or not the targets (time within 10%, communication within 5%) are met; 2 when it
refuses (no root, a bad scenario, shares over the box's cores).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="emu's prediction of a scenario against its run on the testbed (root)",
                       description=" ".join(__doc__.split("\n\n")[2:]).replace("\n", " "))
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value, for every run (repeatable)")
    p.add_argument("--out", help="folder for the profile, the runs and validation.json "
                                 "(default: runs/validate-<name>-<date>-<time>)")
    p.add_argument("--repeat", type=int, default=3, metavar="N", help="testbed runs to compare with (default 3)")
    p.add_argument("--cpu-share", type=float, default=None, metavar="CPUS",
                   help="each machine's CPU in cores (default: real launch --machines' own)")
    p.add_argument("--retries", type=int, default=1, metavar="K",
                   help="run a repetition whose testbed the monitors call unfaithful again, up to K times "
                        "(default 1; its folder is kept as real-<i>-unfaithful-<k>)")
    p.add_argument("--host-speed", choices=("each", "once"), default="each",
                   help="each (default): before every run, time the calibration's step again and "
                        "predict that run from its prices scaled by how far the host's speed moved "
                        "(profile-<i>.yaml, emu-<i>); once: one prediction for every run")
    p.add_argument("--draws", type=int, default=5, metavar="N",
                   help="predict each run as the mean of N draws of emu's timing (compute.spread_draw "
                        "0..N-1), and show their band (default 5; 1: the seed's own draw alone)")
    p.add_argument("--reps", type=int, default=7, help="repetitions of each calibration timing (default 7)")
    p.add_argument("--key-file", help="seal every message with this key, in both runs")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up on a testbed run after this many seconds")
    p.add_argument("--no-code", action="store_true", help="refuse a scenario that names code (as emu run)")


def main(args) -> int:
    from dtemu.core.errors import ScenarioError
    from dtemu.core.runtime.machine_plan import MachinesRefused, plan
    from dtemu.host import cores
    from dtemu.host.scenario_file import check_code, load_scenario
    from dtemu.host.testbed_check import unavailable

    from .fidelity import compare, note_host
    from .speed_probe import moved, probe

    try:
        scenario = load_scenario(args.scenario, args.overrides, allow_code=not args.no_code)
        check_code(scenario)
        why = unavailable()
        if why:
            raise MachinesRefused(why)
        machines = plan(scenario, cores.available(), 1.0, args.cpu_share)
        if args.repeat < 1:
            raise MachinesRefused("--repeat must be at least 1")
        if args.retries < 0:
            raise MachinesRefused("--retries must be 0 or more")
        if args.draws < 1:
            raise MachinesRefused("--draws must be at least 1")
    except (ScenarioError, MachinesRefused) as err:
        print(f"emu validate: refused: {err}", file=sys.stderr)
        return 2
    from dtemu.host import cpu_shares

    cpu_shares.sweep()   # what a killed calibration left
    # SIGTERM and SIGHUP end it as Ctrl-C does: the calibration's groups are removed on the way out.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    out = Path(args.out or f"runs/validate-{scenario.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    # Every trainer at once, as the testbed places them: a machine's trainers in its one share.  Emu
    # shares a machine among its jobs itself (compute.machines: sites), so the profile's step is the
    # machine's: the time each took, over how many shared it.
    busy = sorted({machines.of_node[n] for n in scenario.training_nodes})
    share = min(machines.cpus[m] for m in busy)
    per_machine = max(1, round(len(scenario.training_nodes) / len(busy)))
    common = [a for s in args.overrides for a in ("--set", s)] + (["--key-file", args.key_file] if args.key_file else [])
    common += ["--no-code"] if args.no_code else []

    profile = out / "profile.yaml"
    print(f"emu validate: 1/3 calibrating {scenario.name} under a CPU share of {share:g} -> {profile}", file=sys.stderr)
    _calibrate(scenario, args, share, per_machine, profile)
    calibrated = probe()   # the host's speed as calibrated: each run is bracketed by probes against it
    last = calibrated
    sites = [a for s in machines.emu_sets for a in ("--set", s)]
    # What of the scenario the testbed does not run, said beside every result
    loopback = [f"{', '.join(machines.shared)}: one machine each on the testbed, whose nodes reach each other "
                f"over its loopback, not the scenario's LAN (emu models the same): the LAN's rates are not "
                f"validated"] if machines.shared else []

    def predict(prof: Path, emu: Path) -> list[Path]:
        """Emu's run into ``emu``, and its other draws of timing beside it: their folders."""
        folders = [emu] + [emu.with_name(f"{emu.name}-draw{k}") for k in range(1, args.draws)]
        for k, folder in enumerate(folders):
            draw = ["--set", f"compute.spread_draw={k}"] if k else []
            _run([sys.executable, "-m", "dtemu.emu.cli", "run", args.scenario, "--no-tui", "--out", str(folder),
                  "--profile", str(prof), *common, *sites, *draw], folder.with_name(folder.name + ".log"),
                 args.timeout)
        return folders

    calibrated_draws: list[Path] = []

    def as_calibrated() -> list[Path]:
        """The prediction from the calibration as measured (``--host-speed once``, or where a run's step
        could not be timed again), made the first time a run needs it."""
        if not calibrated_draws:
            print("emu validate: 2/3 predicting (emu run)", file=sys.stderr)
            calibrated_draws.extend(predict(profile, out / "emu"))
        return calibrated_draws

    records = []
    share_args = ["--cpu-share", repr(args.cpu_share)] if args.cpu_share is not None else []
    launch = [sys.executable, "-m", "dtemu.real.cli", "launch", args.scenario, "--machines", "netns",
              "--time-scale", "1", "--no-tui", "--timeout", repr(args.timeout), *share_args, *common]
    for i in range(1, args.repeat + 1):
        real, given_up, emus, factor, unfollowed = out / f"real-{i}", [], [], 1.0, []
        if args.host_speed == "each":
            # The host's speed drifts by 10% or more within an hour (notebook entry 37): this run is
            # predicted from the calibration's prices moved as its step moved since, timed just now.
            # The first run too: a calibration takes minutes, and fid38's geo BiSparse calibrated 11-14%
            # slower than its step timed before runs 2 and 3, whose testbed was as fast as run 1's
            # (notebook entry 51).
            try:
                factor = _follow_host(scenario, args, share, profile, out / f"profile-{i}.yaml")
            except RuntimeError as err:   # (a timing that failed: this run is predicted as calibrated)
                unfollowed = [f"run {i}: the host's speed could not be timed again ({err}); "
                              f"predicted from the calibration"]
                print(f"emu validate: warning: {unfollowed[0]}", file=sys.stderr)
            else:
                print(f"emu validate: 2/3 predicting run {i}: the step takes {factor:.3f}x the calibration's",
                      file=sys.stderr)
                emus = predict(out / f"profile-{i}.yaml", out / f"emu-{i}")
        emus = emus or as_calibrated()
        for attempt in range(args.retries + 1):
            print(f"emu validate: 3/3 testbed run {i} of {args.repeat}{f' (again: {attempt})' if attempt else ''} "
                  f"(real launch --machines netns) -> {real}", file=sys.stderr)
            code = _run([*launch, "--out", str(real)], out / f"real-{i}.log", args.timeout + 120, check=False)
            after = probe()
            record = {"repetition": i, "scenario": args.scenario, "mode": scenario.mode, "sets": list(args.overrides),
                      "real_exit": code, "emu": emus[0].name, "emu_draws": [e.name for e in emus],
                      "host_factor": round(factor, 4), **compare(scenario, real, emus)}
            note_host(record, moved(calibrated, last), moved(calibrated, after))
            record["warnings"] = [*unfollowed, *loopback, *record["warnings"]]
            last = after
            if record["faithful"] or attempt == args.retries:
                break
            # Its monitors say the testbed was not the machines emu predicted: run it again, and keep
            # what this one measured beside the record (its folder too).
            given_up.append(_set_aside(record, real, out / f"real-{i}-unfaithful-{attempt + 1}"))
            print(f"emu validate: run {i} was on an unfaithful testbed ({'; '.join(record['testbed_why'])}): "
                  f"running it again", file=sys.stderr)
        record["unfaithful_attempts"] = given_up
        records.append(record)
        (out / "validation.json").write_text(json.dumps(records, indent=1))
    print(table(records))
    for warning in sorted({w for r in records for w in r.get("warnings", [])}):
        print(f"emu validate: warning: {warning}")
    print(f"emu validate: {sum(r['within_targets'] for r in records)} of {len(records)} repetitions within the "
          f"targets (time 10%, comm 5%) on a faithful testbed; records in {out / 'validation.json'}")
    return 0


def _set_aside(record: dict, real: Path, to: Path) -> dict:
    """An unfaithful attempt's folder moved to ``to``, and what it measured."""
    import shutil

    if to.exists():
        shutil.rmtree(to)
    if real.exists():
        real.rename(to)
    log = real.with_name(real.name + ".log")
    if log.exists():
        log.rename(to.with_name(to.name + ".log"))
    return {"folder": to.name, "testbed_why": record["testbed_why"], "time_error": record["time_error"],
            "comm_error": record["comm_error"]}


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _calibrate(scenario, args, share: float, per_machine: int, profile: Path) -> None:
    from dtemu.host import cpu_shares

    from .calibrate import measure, write

    t0 = time.perf_counter()
    # (The caches and memory the machines still share are a fact of the testbed, known before it runs.)
    with cpu_shares.confined(share):
        measured = measure(scenario, args.reps, together=True, share=share, per_machine=per_machine)
    measured["measured"]["cpu_share"] = share
    how = "".join(f" --set {s}" for s in args.overrides) + f" --together --cpu-share {share:g}"
    write(measured, profile, args.scenario, how, time.perf_counter() - t0)


def _follow_host(scenario, args, share: float, profile: Path, to: Path) -> float:
    """The calibration's reference step timed again in its share (emu.calibrate.host_speed), and
    ``profile``'s prices scaled by how far it moved, written to ``to``; the factor."""
    import yaml

    from dtemu.host import cpu_shares

    from .calibrate import host_speed, scaled, write

    t0 = time.perf_counter()
    calibrated = yaml.safe_load(profile.read_text())
    with cpu_shares.confined(share):
        factor = host_speed(scenario, calibrated, share)
    write(scaled(calibrated, factor), to, args.scenario,
          f" (then {profile.name}'s prices x{factor:.4f}: its reference step timed again)", time.perf_counter() - t0)
    return factor


def _run(cmd: list[str], log: Path, timeout_s: float, check: bool = True) -> int:
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        try:
            p.wait(timeout=timeout_s)
        except BaseException:   # (Ctrl-C, SIGTERM, the timeout) ended as they end a launch, so that its
            p.terminate()       # machines are removed: SIGKILL would leave them to the next launch
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            raise
    if check and p.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise SystemExit(f"emu validate: {' '.join(cmd[2:5])} failed with exit {p.returncode}; {log}:\n{tail}")
    return p.returncode


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def band(values) -> str:
    """A band of errors, lowest to highest ("" for none)."""
    values = [v for v in values or [] if v is not None]
    return f"{_pct(min(values))} to {_pct(max(values))}" if values else ""


def table(records: list[dict]) -> str:
    lines = ["| run | units | real s | emu s | time error | real comm s | emu comm s | comm error | "
             "one draw's time, comm error | same model | faithful |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in records:
        drawn = r.get("draws") or {}
        draws = (f"{band(drawn.get('time_error'))}, {band(drawn.get('comm_error'))} ({drawn['count']} draws)"
                 if drawn else "")
        lines.append(f"| {r['repetition']} | {r['units']} {r['unit']}s | {r.get('real_s', 0):.3f} | "
                     f"{r.get('emu_s', 0):.3f} | {_pct(r['time_error'])} | {r.get('real_comm_s', 0):.3f} | "
                     f"{r.get('emu_comm_s', 0):.3f} | {_pct(r['comm_error'])} | {draws} | "
                     f"{'yes' if r['same_model'] else 'no'} | "
                     f"{'yes' if r['faithful'] else 'NO: ' + '; '.join(r['testbed_why'])} |")
    return "\n".join(lines)
