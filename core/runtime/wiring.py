"""Which rank runs which role, and what it reads and writes: written once for both runtimes.

FL: rank 0 is the controller, ranks 1..N the clients.  DDP: ranks 0..W-1 are
the workers.  A ``RoleSpec`` starts its role on a ``Context`` with the
checkpoint to resume from (the FL controller; emu hands a restarted
controller its latest checkpoint, real ``fl.init_path``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from dtemu.core.ddp.worker import worker
from dtemu.core.fl.client import client
from dtemu.core.fl.controller import controller
from dtemu.core.fl.population import Population
from dtemu.core.ml.workload import Workload
from dtemu.core.scenario import CONTROLLER, Scenario
from dtemu.core.wire.topics import CLIENT_UPDATE, COLL_FRAMES, MODEL_BLOB, TRAIN_CMD


@dataclass(frozen=True)
class RoleSpec:
    rank: int
    name: str
    subscribes: tuple[str, ...]
    publishes: tuple[str, ...]
    # start(ctx, init): the role's generator; init the checkpoint bytes to resume from, or None
    start: Callable[[Any, bytes | None], Any]


def role_of(scenario: Scenario, rank: int, work: Workload, key: bytes | None = None,
            population: Population | None = None) -> RoleSpec:
    """The role of ``rank``; ``key`` seals FL messages (core.wire.auth); ``population``: the FL
    controller's availability and sampling (a trace's windows, read by the host)."""
    name = scenario.node_names[rank]
    if scenario.mode == "ddp":
        return RoleSpec(rank, name, (COLL_FRAMES,), (COLL_FRAMES,),
                        lambda ctx, init: worker(ctx, scenario, work, rank))
    if name == CONTROLLER:
        return RoleSpec(rank, name, (CLIENT_UPDATE,), (TRAIN_CMD, MODEL_BLOB),
                        lambda ctx, init: controller(ctx, scenario, work, init, key, population))
    return RoleSpec(rank, name, (TRAIN_CMD, MODEL_BLOB), (CLIENT_UPDATE,),
                    lambda ctx, init: client(ctx, scenario, work, rank, key))


def roles(scenario: Scenario, work: Workload, key: bytes | None = None,
          population: Population | None = None) -> list[RoleSpec]:
    return [role_of(scenario, rank, work, key, population) for rank in range(len(scenario.node_names))]
