"""Machines on one box: ``real launch SCENARIO --machines netns``.

Each machine is a network namespace behind a shaped link (real.machine_net) and a CPU share
(host.cpu_shares), after Mininet-HiFi's container-based hosts.  Which node runs on which machine,
behind which link and with how much CPU is the plan's (core.runtime.machine_plan).

Every way out removes what was made (``Machines.__exit__``, and the launcher's signal handlers), and
a rank dies with its launcher (``PR_SET_PDEATHSIG``).  A launcher killed with SIGKILL leaves its
namespaces and groups behind; the next launch removes them (``sweep``), by their tag's pid.
"""

from __future__ import annotations

import ctypes
import os
import signal

from dtemu.core.runtime.machine_plan import Plan
from dtemu.host import cpu_sets, cpu_shares
from dtemu.host.cpu_shares import CpuGroup

from . import machine_net
from .machine_net import MachineNet
from .monitors import Monitor


def sweep() -> list[str]:
    """Remove the namespaces and CPU groups of launchers (and calibrations) that no longer run."""
    removed = []
    for ns in machine_net.namespaces():
        m = machine_net.TAG.match(ns)
        if m and not cpu_shares.alive(int(m.group(1))):
            machine_net._run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    return removed + cpu_shares.sweep()


class Machines:
    """The testbed of a ``plan``: a context manager that makes it, and removes it on every way out."""

    # After every rank is ready, DDS discovery across the shaped links takes a while; roles that send
    # at once (geo's) would otherwise lose their first messages to it.  The run's clock starts after it.
    settle_s = 3.0

    def __init__(self, p: Plan, mtu: int = 1500, tag: str | None = None):
        self.plan = p
        self.tag = tag or f"dtm{os.getpid()}"
        self.net = MachineNet(self.tag, p.links, mtu, labels=p.machines)
        # a machine of several ranks on a CPU of its own where its share fits (host.cpu_sets)
        on = cpu_sets.place(p.cpus, [len(p.nodes_on(i)) for i in range(len(p.machines))])
        self.groups = [CpuGroup(f"{self.tag}-m{i}", c, cpu=on[i]) for i, c in enumerate(p.cpus)]
        self.monitor: Monitor | None = None
        self.swept: list[str] = []

    def __enter__(self) -> "Machines":
        self.swept = sweep()
        try:
            self.net.up()
            for g in self.groups:
                g.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.monitor is not None and self.monitor.is_alive():
            self.monitor.stop()
        errors = []
        for g in self.groups:   # first the groups: what still runs inside is killed with them
            try:
                g.remove()
            except cpu_shares.CpuShareError as err:
                errors.append(str(err))
        self.net.down()
        if errors:
            raise cpu_shares.CpuShareError("; ".join(errors))

    # --- ranks ---------------------------------------------------------
    def machine_of(self, node: str) -> int:
        return self.plan.of_node[node]

    def command(self, node: str, cmd: list[str]) -> list[str]:
        return self.net.exec_prefix(self.machine_of(node)) + cmd

    def peers(self, node: str) -> str:
        """The addresses a rank's DDS discovers: every machine's, its own too where it shares it."""
        own = self.machine_of(node)
        shared = sum(1 for m in self.plan.of_node.values() if m == own) > 1
        return ",".join(a for i, a in enumerate(self.net.addresses) if i != own or shared)

    def env(self) -> dict[str, str]:
        most = max(sum(1 for m in self.plan.of_node.values() if m == i) for i in range(len(self.plan.machines)))
        # Unicast discovery goes to every participant index's port: as many as a machine has ranks, and spare.
        return {"DTEMU_DDS_INTERFACE": "eth0", "DTEMU_DDS_MAX_PARTICIPANTS": str(most + 2)}

    def preexec(self, node: str):
        """What a rank's process runs before it executes: its machine's CPU group, and death with the launcher."""
        group = self.groups[self.machine_of(node)]

        def enter() -> None:
            group.join()
            _die_with_parent()
        return enter

    @property
    def links_flag(self) -> str:
        """real run's --links: the kernel's links as they are, or, without netem, each message held for
        the scenario's latency on top of their rates (real.paced_links)."""
        return "machine" if self.net.netem else "latency"

    # --- monitors ------------------------------------------------------
    def start_monitor(self) -> Monitor:
        self.monitor = Monitor(dict(zip(self.plan.machines, self.groups)), self.net.ports())
        self.monitor.start()
        return self.monitor

    def describe(self) -> dict:
        return {"kind": "netns", "machines": self.plan.describe(), "time_scale": self.plan.scale,
                "machine_cpus": {name: g.cpu if g.cpu is not None else "any"
                                 for name, g in zip(self.plan.machines, self.groups)},
                "cpu_pinning": cpu_sets.unavailable() or "machines of several ranks, where their share fits",
                "cpu_period_us": max(g.period_us for g in self.groups), "netem": self.net.netem,
                "latency": "netem" if self.net.netem else "held by the receiving rank (no netem)",
                "not_applied": sorted({k for a in self.net.applied() for k in a["not_applied"]} - {"latency_ms"}),
                "swept": self.swept}


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
