"""``real launch --machines netns``: a launch whose ranks run on machines of their own (real.machines).

Before the ranks start: refuse where the testbed cannot be made (exit 2, one line), time a trainer's
step under its CPU share for the time scale, and make the machines, removed on every way out (SIGTERM
and SIGHUP end the launch as Ctrl-C does).  While they run: the monitors' verdict on the dashboard
when it changes.  At the end: summary.json's ``testbed``, the machines as made, the monitors' verdict
and the ``--set``s that make emu model the run.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from dtemu.core import events as ev
from dtemu.core.runtime.machine_plan import MachinesRefused, plan
from dtemu.core.scenario import Scenario
from dtemu.host import cores
from dtemu.host.testbed_check import unavailable

from .machines import Machines


def launch_on_machines(args, scenario: Scenario, run) -> int:
    """``run(args, scenario, machines)``: the launch itself (real.launch), on the machines made here."""
    why = unavailable()
    try:
        if why:
            raise MachinesRefused(why)
        first = plan(scenario, cores.available(), 1.0, args.cpu_share)
    except MachinesRefused as err:
        print(f"real launch: --machines {args.machines} refused: {err}", file=sys.stderr)
        return 2
    # Each trainer's share of its machine (a site's workers share theirs): the step is timed under it.
    share = first.trainer_share(scenario.training_nodes)
    scale = args.time_scale
    if scale is None:
        from .calibrate import time_scale

        with cores.spawn_env(cores.wait_policy(1, args.threads or scenario.threads)):
            scale, how = time_scale(scenario, share=share)
        print(f"real launch: time scale {scale:g} ({how}); every scenario duration is stretched by it and every "
              f"link slowed by it (--time-scale 1 turns this off)", file=sys.stderr)
    args.time_scale = scale
    testbed = Machines(plan(scenario, cores.available(), scale, args.cpu_share))
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with testbed:  # removed on every way out; a SIGKILLed launcher's leftovers go at the next launch
            if testbed.swept:
                print(f"real launch: removed what a killed launch left: {', '.join(testbed.swept)}", file=sys.stderr)
            return run(args, scenario, testbed)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM and SIGHUP end a launch as Ctrl-C does: its machines are removed


class LiveVerdict:
    """The monitors' verdict so far, shown on the dashboard when it changes (every few seconds)."""

    EVERY_S = 2.0

    def __init__(self):
        self.last: list[str] | None = None
        self.next = 0.0

    def check(self, machines, dashboard) -> None:
        monitor = machines.monitor
        if monitor is None or time.monotonic() < self.next:
            return
        self.next = time.monotonic() + self.EVERY_S
        from .monitors import judge

        why = judge(monitor.snapshot())["why"]
        if why != self.last:
            self.last = why
            dashboard.observe({"kind": ev.TESTBED, "faithful": not why, "why": why})


def testbed_summary(machines, out: Path, scenario: Scenario) -> dict:
    """summary.json's ``testbed``: the machines as made, and the monitors' verdict (real.monitors)."""
    from .monitors import Samples, judge

    timers = {}
    for rank, node in enumerate(scenario.node_names):
        try:
            timers[node] = json.loads((out / f"rank{rank}" / "summary.json").read_text())["real"]["timers"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    samples = machines.monitor.stop() if machines.monitor is not None else Samples()
    made = {**machines.describe(), "emu_sets": _emu_sets(machines, out, scenario)}
    verdict = judge(samples, timers, planned_loss=max(link.loss for link in machines.plan.links))
    for key in made["not_applied"]:  # (loss needs netem, which this kernel may lack)
        verdict["why"].append(f"the scenario's {key} could not be applied to the links (no netem in this kernel)")
        verdict["faithful"] = False
    if not verdict["faithful"]:
        print("real launch: the testbed was NOT faithful, so this run does not stand for separate machines:\n  "
              + "\n  ".join(verdict["why"]), file=sys.stderr)
    return {**made, **verdict}


def _emu_sets(machines, out: Path, scenario: Scenario) -> list[str]:
    """What emu is given to model this testbed (emu run --set ...): real mode's transport (its
    framing, the writer history the ranks had: a send returns once its last history's worth is on
    the wire, not when it is delivered) and a site's nodes sharing their machine's CPU."""
    from dtemu.host.writer_history import whc_high_bytes

    history = streamed = None
    for rank in range(len(scenario.node_names)):
        try:
            real = json.loads((out / f"rank{rank}" / "summary.json").read_text())["real"]
            history, streamed = real["writer_history"], real.get("stream", False)
            break
        except (OSError, ValueError, KeyError, TypeError):
            continue
    # large payloads on the TCP stream beside DDS (real.stream), or every byte in DDS
    sets = [f"network.framing={'stream' if streamed else 'rtps'}"]
    sets += [f"network.send_window_bytes={whc_high_bytes(history)}"] if history else []
    return sets + machines.plan.emu_sets
