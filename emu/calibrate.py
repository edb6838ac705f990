"""``emu calibrate``: what a scenario's roles cost on this machine, written as a profile.

    emu calibrate SCENARIO [--set KEY=VALUE] [--out PROFILE.yaml] [--reps N]

It measures, on this machine and with this process's arithmetic:

- the training step of the scenario's model at its training batch, threads,
  optimizer and loss, on the scenario's device (``measured.device``: a GPU's
  profile predicts a GPU's runs, wherever emu runs them), on a batch of its own data (best of three timings of 24
  warm steps: other load only slows a step down); with ``--together``, the
  step with every training rank of the scenario training at once (up to 16
  processes; the median machine's pace, host.machine_pace), which is what a run
  whose ranks share this machine sees, and
  every CPU cost below slowed by the same factor (``measured.contention``);
- what the mode's roles spend outside training, as the mode names it
  (emu.costs; emu.federation_costs: FL's and ps's decoding, a client's codec
  encoding and the server's own work; DDP's decoding per MB, geo's decoding and
  its roles' CPU per op), and real mode's framing and writer history: each op
  in CPU seconds, on the ranks' threads (emu.costs.median_cpu_s), given under
  ``--cpu-share`` in the share's seconds (CPU seconds over the share), as the
  messages' prices are;
- what one message costs the CPU over DDS, each side, whatever its size
  (real.message_costs, run as a command: a writer and a reader process, on loopback), on the path
  the run's messages take (``--messages-over``): beside DDS in shared memory, as ranks on one machine
  send them (real launch), or every byte through DDS, as the testbed's machines and several hosts
  do (the default under ``--cpu-share``).

It writes them to a profile (host.profile) that records the machine.
``emu run SCENARIO --profile FILE``, or ``compute.profile: FILE`` in the
scenario, applies it: emu then predicts what this machine would take, before
anything runs for real.  A run whose ranks share this machine is calibrated
with ``--together`` (docs/fidelity.md measures both ways against real runs);
``compute.shared_cores`` stays set by hand.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from dtemu.host import stream_choice


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure what a scenario's roles cost on this machine (a profile)",
                       description=" ".join(__doc__.split("\n\n")[2:]).replace("\n", " "))
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value before measuring (repeatable)")
    p.add_argument("--out", help="profile file to write (default: profiles/<name>-<host>.yaml)")
    p.add_argument("--reps", type=int, default=7, help="repetitions of each timing, median taken (default: 7)")
    p.add_argument("--no-code", action="store_true", help="refuse a scenario that names code (as emu run)")
    p.add_argument("--together", action="store_true",
                   help="time training with every training rank of the scenario at once on this machine (a run "
                        "whose ranks share it: real launch here, a testbed of namespaces); default: one rank alone, "
                        "as on a machine of its own")
    p.add_argument("--cpu-share", type=float, default=None, metavar="CPUS",
                   help="(root) time everything under this much of a core, as a machine of real launch "
                        "--machines has (host.cpu_shares: the same quota and 5 ms period); recorded in the profile")
    p.add_argument("--messages-over", choices=("shm", "dds", "stream"), default=None,
                   help="the path messages are priced on: shm, large payloads beside DDS (real launch on one "
                        "machine, unsealed); dds, every byte through DDS (real launch --machines, several hosts); "
                        "stream, large payloads on the TCP stream beside DDS (DTEMU_DDS_STREAM=1); "
                        "default: under --cpu-share the stream where DTEMU_DDS_STREAM says so, else dds; else shm")


def measure(scenario, reps: int = 7, together: bool = False, share: float | None = None,
            per_machine: int = 1, messages_over: str | None = None) -> dict:
    """The profile of ``scenario`` on this machine (host.profile's format); ``together``: its
    training timed with every training rank at once (``--together``); ``share``: in CPU shares
    (the caller runs the rest under one: host.cpu_shares.confined), ``per_machine`` ranks to a share,
    as the testbed places them.  A machine's ranks then share it, and the step is given per machine
    (its pace: the time its ranks took for their steps over ``per_machine``, host.machine_pace; the
    spread too is the machine's): emu shares a machine among its jobs itself
    (compute.machines: sites).  ``messages_over``: the path messages are priced on
    (real.message_costs' ``shm`` or ``dds``; default ``dds`` under a share, the testbed's)."""
    from dtemu.host import devices, heap
    from dtemu.host.datasets import load_for
    from dtemu.host.train_cost import MAX_TOGETHER, sample_of, spread_parts, warmup_of
    from dtemu.host.resolve import resolve

    from .costs import seal_cost

    heap.keep()   # timed as the ranks will train (real.cli)
    # every mode's messages cost the transport's CPU, whatever their size, and (sealed) per MB
    over = messages_over or messages_path(share)
    messages = [*_message_sets(share, over), f"compute.default.seal_s_per_mb={_in_share(seal_cost(reps), share):.6e}"]
    if not scenario.kind.own_model:  # (a Flower app) its own model: its costs time its training too
        # its calls in CPU seconds (emu.costs.flower_sets), in the share's as every op's, as slow as
        # the reference model's training together makes them
        calls = [_share_of(a, share, every=True) for a in resolve(scenario.kind.costs)(scenario, reps)]
        contention, reference = _app_contention(scenario, together, share, per_machine)
        return _profile(scenario, [_times(a, contention, every=True) for a in [*calls, *messages]],
                        {"model": "the app's own", "reps": reps, "messages_over": over,
                         "contention": round(contention, 3), "contention_of": "small_cnn" if together else None,
                         "reference": reference})
    data = load_for(scenario)
    sample = sample_of(data, scenario)
    # Ranks that train at once on one machine slow each other down, even where they fit its cores
    # (hyperthreads, memory bandwidth): only timing them together says how much.
    ranks = min(len(scenario.training_nodes), MAX_TOGETHER) if together else 1
    device = devices.resolve(scenario)   # (where the step below is timed)
    runs: list[list[float]] = []
    warmups: list[list[float]] = []   # (fresh processes only: the trainers timed together)
    train = alone = _step(scenario, 1, sample, share, 1, runs)
    contention = 1.0
    if ranks > 1:
        # The ranks' other CPU work (decoding, codecs, each message) is slowed as their training
        # is: every cost below, timed alone, takes the factor the training took together.
        runs = []
        train = _step(scenario, ranks, sample, share, per_machine, runs, warmups)
        contention = max(1.0, train / alone)
    # The roles' ops, timed in CPU seconds with the ranks' threads (emu.costs.median_cpu_s), in the
    # share's seconds as the step is (``_in_share``), as slow as the ranks' training together makes them
    with _threads(scenario.threads):
        ops = [_share_of(a, share) for a in resolve(scenario.kind.costs)(scenario, reps)]
    costs = [_times(a, contention) for a in [*ops, *messages]]
    # How much a job varies where it was timed (co-runners, the quota's periods, the hypervisor): a
    # part that outlasts a job and a step's own, which a long job averages out (notebook entry 35).
    spread, per_sample = spread_parts(runs, scenario.kind.batch_size(scenario))
    assignments = [f"compute.default.train_s_per_sample={train:.6e}", f"compute.default.spread={spread:.4f}",
                   f"compute.default.spread_per_sample={per_sample:.4f}", *costs]
    warm = warmup_of(warmups, per_machine)
    if warm:
        # A rank's first steps hold torch's lazy set-up, which the steady steps above leave out: a short
        # run's first units were 0.1-0.8 s slower on the testbed (notebook entries 43, 44).
        assignments.insert(3, f"compute.default.warmup_s=[{', '.join(f'{w:.4f}' for w in warm)}]")
    return _profile(scenario, assignments, {"model": scenario.model_spec, "batch_size": scenario.kind.batch_size(scenario),
                                            "threads": scenario.threads, "messages_over": over,
                                            "input_shape": list(sample[0].shape[1:]),
                                            "input_dtype": str(sample[0].dtype), "reps": reps,
                                            "ranks_training_at_once": ranks, "ranks_per_machine": per_machine,
                                            "contention": round(contention, 3),
                                            "reference": _reference(scenario.model_spec, ranks, per_machine, train),
                                            # where the step was timed: a GPU's profile predicts a GPU's
                                            # runs, wherever emu runs them
                                            "device": device, **devices.describe(device)})


# Times the trainers are timed together, the median taken: one timing of a few seconds moved
# by 4-13% from one to the next on this box (notebook entry 36), and it sets every row's step.
TOGETHER_REPEATS = 3


def _median_together(scenario, ranks: int, sample, share, per_machine: int, runs: list | None = None,
                     warmups: list | None = None) -> float:
    """host.train_cost.measured_together's seconds per sample, the median of TOGETHER_REPEATS timings
    (``runs``: every process's steps of all of them, for the spread; ``warmups``: each fresh process's
    start-up in its first steps)."""
    from dtemu.host.train_cost import measured_together

    times = sorted(measured_together(scenario, ranks, sample, share=share, per_group=per_machine, step_times=runs,
                                     warmups=warmups)
                   for _ in range(TOGETHER_REPEATS))
    return times[len(times) // 2]


def _step(scenario, ranks: int, sample, share, per_machine: int, runs: list | None = None,
          warmups: list | None = None) -> float:
    """Seconds per sample of the scenario's step, per machine: alone, the best of three timings of 24
    warm steps (other load only slows a step down); ``ranks`` > 1, the median of their timings at once
    over ``per_machine`` (``_median_together``).  ``runs`` gets each timing's steps, a list each."""
    from dtemu.host.train_cost import measured_s_per_sample

    if ranks > 1:
        return _median_together(scenario, ranks, sample, share, per_machine, runs, warmups) / per_machine
    timed: list[list[float]] = [[], [], []]
    best = min(measured_s_per_sample(scenario, steps=24, sample=sample, step_times=steps) for steps in timed)
    if runs is not None:
        runs.extend(timed)
    return best


def _reference(model: str, ranks: int, per_machine: int, s_per_sample: float) -> dict:
    """The step a profile's prices move with when the host's speed moves (``host_speed``): which model,
    timed how, and what it took."""
    return {"model": model, "ranks": ranks, "per_machine": per_machine, "s_per_sample": float(f"{s_per_sample:.6e}")}


def host_speed(scenario, profile: dict, share: float | None) -> float:
    """How many times as long the profile's reference step takes now as when it was measured (> 1:
    the host got slower), timed again the same way, under the same ``share`` (the caller confines
    this process to it, as ``measure``'s).  A host's speed drifts by 10% or more within an hour of the
    same work (notebook entry 37): ``emu validate`` follows it between its runs."""
    ref = profile["measured"]["reference"]
    subject, sample = _proxy(scenario), None
    if scenario.kind.own_model:
        from dtemu.host.datasets import load_for
        from dtemu.host.train_cost import sample_of

        subject, sample = scenario, sample_of(load_for(scenario), scenario)
    return _step(subject, ref["ranks"], sample, share, ref["per_machine"]) / ref["s_per_sample"]


def scaled(profile: dict, factor: float) -> dict:
    """``profile`` with every CPU price (each ``..._s_per_...`` key: the step, the ops, the messages,
    the seal; and a process's warm-up) times ``factor``, as the host's speed moved; the factor recorded
    in ``measured``."""
    sets = {k: (_times_each(v, factor) if "_s_per_" in k or k.endswith(".warmup_s") else v)
            for k, v in profile["sets"].items()}
    return {**profile, "measured": {**profile["measured"], "host_factor": round(factor, 4)}, "sets": sets}


def _times_each(value, factor: float):
    """A price, or a list of them (a warm-up step by step), times ``factor``."""
    if isinstance(value, list):
        return [_times_each(v, factor) for v in value]
    return float(f"{value * factor:.6e}")


def _proxy(scenario):
    """The reference model an app whose model is its own is timed by (small_cnn, the scenario's threads)."""
    import dataclasses

    return dataclasses.replace(scenario, model="small_cnn", task=None)


def _times(assignment: str, factor: float, every: bool = False) -> str:
    """A ``--set`` of a CPU cost (seconds per MB or per message; ``every``: per sample too) times
    ``factor``; others as they are."""
    key, _, value = assignment.partition("=")
    if factor == 1.0 or not key.endswith(("_s_per_mb", "_s_per_message") + (("_s_per_sample",) if every else ())):
        return assignment
    return f"{key}={float(value) * factor:.6e}"


def _app_contention(scenario, together: bool, share: float | None, per_machine: int) -> tuple[float, dict]:
    """How much slower a Flower app's calls run with every client training at once (``--together``)
    than the one at a time its calibration timed them, and the reference step (``_reference``): an
    app's model is its own and cannot be stepped apart from it, so the factor is a reference model's
    (small_cnn: a step alone, then with as many processes at once as the testbed's clients, each in
    its share), as every rank's work on one box slows alike (caches, memory bandwidth, hyperthreads)."""
    from dtemu.host.train_cost import MAX_TOGETHER

    ranks = min(len(scenario.training_nodes), MAX_TOGETHER) if together else 1
    proxy = _proxy(scenario)
    alone = _step(proxy, 1, None, share, 1)
    if ranks < 2:
        return 1.0, _reference(proxy.model_spec, 1, 1, alone)
    at_once = _step(proxy, ranks, None, share, per_machine)
    return max(1.0, at_once / alone), _reference(proxy.model_spec, ranks, per_machine, at_once)


def messages_path(share: float | None) -> str:
    """The path a run's messages take, to price them on: on the testbed's machines (``share``) DDS, or
    the TCP stream beside it where real mode's lan profile takes it now (host.stream_choice); else
    one machine's shared memory."""
    if not share:
        return "shm"
    return "stream" if stream_choice.stream_on("lan") else "dds"


def _message_sets(share: float | None = None, over: str = "shm") -> list[str]:
    """A message's own CPU over DDS, each side, per message and per MB (real.message_costs, run as a
    command: a writer and a reader process on loopback, on the path ``over``), or nothing where
    CycloneDDS is not there (emu needs it for nothing else).  Those are CPU seconds, given in the
    ``share``'s (``_in_share``)."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("cyclonedds") is None:
        return []
    done = subprocess.run([sys.executable, "-m", "dtemu.real.message_costs", "--measure", "--path", over],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"measuring a message's cost over DDS failed: {done.stderr.strip()[-500:]}")
    costs = json.loads(done.stdout.strip().splitlines()[-1])
    return [f"compute.default.{side}_s_per_{unit}={_in_share(costs[key], share):.6e}"
            for side in ("send", "recv") for unit, key in (("message", side), ("mb", f"{side}_per_mb"))]


def _share_of(assignment: str, share: float | None, every: bool = False) -> str:
    """A ``--set`` of an op's CPU seconds (per MB or per message; ``every``: per sample too) in the
    ``share``'s seconds; others as they are."""
    return _times(assignment, 1 / share, every) if share else assignment


@contextlib.contextmanager
def _threads(n: int):
    """torch's threads set to ``n`` for a while, as a rank runs (real.cli): an op timed with the
    box's default threads under a quota spins them against each other (DGC's apply came out at 22 ms
    a MB so, 4.5 on one thread: notebook entry 38)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _in_share(cpu_s: float, share: float | None) -> float:
    """CPU seconds as a machine under a CPU ``share`` spends them (its other work is timed in wall
    seconds within the share, where a second of CPU takes 1/share of them); alone, the same."""
    return cpu_s / share if share else cpu_s


def _profile(scenario, assignments: list[str], measured: dict) -> dict:
    import yaml

    from dtemu.host import profile as profiles

    sets = {}
    for a in assignments:
        key, _, value = a.partition("=")
        sets[key] = yaml.safe_load(value)
    return {"format": profiles.FORMAT, "machine": profiles.machine(),
            "measured": {"scenario": scenario.name, "mode": scenario.mode, **measured}, "sets": sets}


def write(profile: dict, out: Path, scenario_path: str, how: str, seconds: float) -> None:
    """The profile as YAML, headed by the command that made it and the one that applies it."""
    import yaml

    out.parent.mkdir(parents=True, exist_ok=True)
    head = (f"# emu calibrate {scenario_path}{how}  ({seconds:.0f} s)\n"
            f"# apply: emu run {scenario_path} --profile {out}\n")
    out.write_text(head + yaml.safe_dump(profile, sort_keys=False))


def main(args) -> int:
    from dtemu.core.errors import ScenarioError
    from dtemu.host.scenario_file import check_code, load_scenario

    try:
        scenario = load_scenario(args.scenario, args.overrides, allow_code=not args.no_code)
        check_code(scenario)
    except ScenarioError as err:
        print(f"emu calibrate: {err}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    share, over = getattr(args, "cpu_share", None), getattr(args, "messages_over", None)
    if share is not None:
        from dtemu.host import cpu_shares

        why = cpu_shares.unavailable()
        if why or share <= 0:
            print(f"emu calibrate: --cpu-share {share:g} refused: {why or 'a share is a positive number of cores'}",
                  file=sys.stderr)
            return 2
        # Every timing below, and the reader process the message costs start, runs under the share.
        with cpu_shares.confined(share):
            profile = measure(scenario, args.reps, together=args.together, share=share, messages_over=over)
        profile["measured"]["cpu_share"] = share
    else:
        profile = measure(scenario, args.reps, together=args.together, messages_over=over)
    host = profile["machine"]["cpu"].split(" (")[0].replace(" ", "_")
    out = Path(args.out or f"profiles/{scenario.name}-{host}.yaml")
    how = ("".join(f" --set {s}" for s in args.overrides) + (" --together" if args.together else "")
           + (f" --cpu-share {share:g}" if share is not None else "")
           + (f" --messages-over {over}" if over else ""))
    write(profile, out, args.scenario, how, time.perf_counter() - t0)
    for key, value in profile["sets"].items():
        print(f"  {key}: {value}")
    print(f"{scenario.name}: profile of {profile['machine']['cpu']} -> {out}")
    return 0
