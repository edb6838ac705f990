"""Faults from outside a node, in virtual time: offline windows, and the log of partitions.

Everything else (crashes at protocol points, lost / duplicated / held-back
messages, partitions' cuts, dropouts, corrupt updates) is the driver's
(``core.runtime.driver``), the same in both runtimes.

- ``faults.offline``: at ``start_s`` the node crashes (state, inbox and flows
  lost); at ``end_s`` it restarts from scratch and gets the latest model.
"""

from __future__ import annotations

from dtemu.core import events as ev
from dtemu.core.scenario import Scenario


def schedule_offline(world, scenario: Scenario) -> set[str]:
    """Schedule the crash windows; returns the nodes that are down from the start."""
    down_at_start = set()
    for window in scenario.faults.offline:
        if window.start_s == 0:
            down_at_start.add(window.node)
        world.env.process(_offline(world, window.node, window.start_s, window.end_s))
    return down_at_start


def schedule_partitions(world, scenario: Scenario) -> None:
    """Log each partition as it starts and heals (the cut itself is the receiving driver's)."""
    for part in scenario.faults.partitions:
        world.env.process(_partition(world, part))


def _partition(world, part):
    yield world.env.timeout(part.start_s)
    world.emit(part.nodes[0], ev.FAULT, fault="partition_start", nodes=list(part.nodes))
    yield world.env.timeout(part.end_s - part.start_s)
    world.emit(part.nodes[0], ev.FAULT, fault="partition_end", nodes=list(part.nodes))


def _offline(world, node: str, start_s: float, end_s: float | None):
    if start_s > 0:
        yield world.env.timeout(start_s)
        world.crash(node)
    else:
        world.crash(node)  # never started: this marks it down and logs it
    if end_s is not None:
        yield world.env.timeout(end_s - start_s)
        world.restart(node)
