"""Faults of an emulated run: crash windows with restarts, per-round dropouts, partitions.

All are decided from the scenario's seed (core.faults), so a run is repeatable.

- ``faults.offline``: at ``start_s`` the node crashes (state, inbox and flows
  lost); at ``end_s`` it restarts from scratch and gets the latest model.
- ``faults.dropout_p``: each client sits out each round with this probability:
  the round's TrainCmd does not reach it (it is busy, asleep, out of battery),
  so it neither trains nor answers in that round.
"""

from __future__ import annotations

from dtemu.core.runtime.faults import drops_round, peek
from dtemu.core.wire.messages import TrainCmd
from dtemu.core.runtime.requests import TRAIN_CMD, Message
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
    """Log each partition as it starts and heals (the cut itself is World.delivery's)."""
    for part in scenario.faults.partitions:
        world.env.process(_partition(world, part))


def _partition(world, part):
    yield world.env.timeout(part.start_s)
    world.emit(part.nodes[0], "fault", fault="partition_start", nodes=list(part.nodes))
    yield world.env.timeout(part.end_s - part.start_s)
    world.emit(part.nodes[0], "fault", fault="partition_end", nodes=list(part.nodes))


def _offline(world, node: str, start_s: float, end_s: float | None):
    if start_s > 0:
        yield world.env.timeout(start_s)
        world.crash(node)
    else:
        world.crash(node)  # never started: this marks it down and logs it
    if end_s is not None:
        yield world.env.timeout(end_s - start_s)
        world.restart(node)


class DropoutFilter:
    """A delivery hook: swallows the TrainCmd of a round a client sits out."""

    def __init__(self, scenario: Scenario, emit):
        self.seed = scenario.seed
        self.p = scenario.faults.dropout_p
        self.ranks = {name: rank for rank, name in enumerate(scenario.node_names)}
        self.emit = emit

    def __call__(self, msg: Message, dst: str) -> bool:
        if self.p <= 0 or msg.topic != TRAIN_CMD:
            return True
        cmd = peek(msg.data)  # sealed or not; anything else is the client's to judge
        if isinstance(cmd, TrainCmd) and drops_round(self.seed, self.ranks[dst], cmd.round, self.p):
            self.emit(dst, "dropout", round=cmd.round)
            return False
        return True
