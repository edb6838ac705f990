"""Which node runs on which testbed machine, behind which link, with how much CPU (pure: no I/O).

real launch --machines makes the machines of a plan (real.machines); emu validate calibrates each
trainer's step on the share the plan gives it, and emu models the same machines
(``compute.machines: sites``).  Where the scenario has sites (geo always; FL or DDP with
``network.sites``), a site is one machine with its nodes inside, and its link is the site's WAN
attachment; otherwise every node is a machine of its own behind its access link.

Under a time scale X every duration is X times as long, so every link is X times as slow (rate / X,
latency x X): the testbed is the scenario's machines run X times slower.

Each machine gets ``cpus`` of a core (by default the box's cores less a fifth, split evenly: at a
tenth kept back, busy machines received 92-95% of their shares here; at a fifth, 98-99%), never
more than its nodes' threads can use.  Shares over what the box gives the machines are refused:
machines that share cores are not separate machines.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtemu.core.errors import DtemuError
from dtemu.core.runtime.network_spec import LinkSpec

RESERVE = 0.2   # of the box's cores, kept for the launcher, the monitors and the kernel's packet path


class MachinesRefused(DtemuError):
    """The testbed cannot be made here (no root, no controller, shares over the cores): exit 2."""


@dataclass(frozen=True)
class Plan:
    machines: list[str]          # each machine's name: a site's, or its one node's
    of_node: dict[str, int]      # node -> its machine's index
    links: list[LinkSpec]        # each machine's link (its rates already divided by the time scale)
    cpus: list[float]
    scale: float

    @property
    def emu_sets(self) -> list[str]:
        """What emu is given to model these machines: where one holds several nodes, they share its CPU
        (compute.machines: sites, emu/machines.py)."""
        return ["compute.machines=sites"] if len(self.machines) < len(self.of_node) else []

    @property
    def shared(self) -> list[str]:
        """The machines that hold several nodes: these reach each other over its loopback, which no
        link shapes (a geo site's LAN is not on the testbed; emu models the loopback)."""
        return [name for i, name in enumerate(self.machines) if len(self.nodes_on(i)) > 1]

    def nodes_on(self, machine: int) -> list[str]:
        return [n for n, m in self.of_node.items() if m == machine]

    def trainer_share(self, trainers: list[str]) -> float:
        """The CPU each trainer has while all of its machine's trainers train: its machine's share
        split among them (what real launch and emu validate time a step under)."""
        per = [self.cpus[m] / k for m in range(len(self.machines))
               if (k := sum(1 for n in trainers if self.of_node[n] == m))]
        return min(per) if per else min(self.cpus)

    def describe(self) -> list[dict]:
        return [{"machine": name, "nodes": sorted(self.nodes_on(i)), "cpus": self.cpus[i],
                 "up_mbps": self.links[i].up_mbps, "down_mbps": self.links[i].down_mbps,
                 "latency_ms": self.links[i].latency_ms, "loss": self.links[i].loss}
                for i, name in enumerate(self.machines)]


def plan(scenario, cores: int, scale: float = 1.0, cpus: float | None = None) -> Plan:
    """Which node runs on which machine, each machine's link and CPU share, on a box of ``cores``."""
    site_of = scenario.site_of
    machines: list[str] = []
    of_node: dict[str, int] = {}
    for node in scenario.node_names:
        name = site_of.get(node, node)
        if name not in machines:
            machines.append(name)
        of_node[node] = machines.index(name)
    links = []
    for name in machines:
        if name in scenario.network.sites:
            wan = scenario.network.sites[name].wan
            spec = LinkSpec(up_mbps=wan.up_mbps, down_mbps=wan.down_mbps, latency_ms=wan.latency_ms,
                            loss=scenario.network.default.loss)
        else:
            spec = scenario.link(name)
        links.append(LinkSpec(spec.up_mbps / scale, spec.down_mbps / scale, spec.latency_ms * scale, spec.loss))
    room = round(cores * (1 - RESERVE), 3)
    want = []
    for i in range(len(machines)):
        usable = scenario.threads * sum(1 for m in of_node.values() if m == i)  # what its nodes' threads can use
        want.append(round(min(usable, cpus if cpus is not None else room / len(machines)), 3))
    if sum(want) > room + 1e-9:
        raise MachinesRefused(f"{len(machines)} machines at {max(want):g} CPU each need {sum(want):g} cores; this box "
                              f"gives the machines {room:g} of its {cores} (--cpu-share {room / len(machines):.3g} "
                              f"or less): machines that share cores are not separate machines")
    return Plan(machines, of_node, links, want, scale)
