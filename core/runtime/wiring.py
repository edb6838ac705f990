"""Which rank runs which role, and what it reads and writes: written once for both runtimes.

FL: rank 0 is the controller, ranks 1..N the clients.  DDP: ranks 0..W-1 are
the workers.  ps: rank 0 the parameter server, 1 the state server, 2.. the workers.  A ``RoleSpec`` starts its role on a ``Context`` with the
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
from dtemu.core.fl.residuals import Residuals
from dtemu.core.geo import roles as geo
from dtemu.core.geo.spec import FLAT_PS, GLOBAL_PS, MASTER
from dtemu.core.ml.workload import Workload
from dtemu.core.scenario import CONTROLLER, Scenario
from dtemu.core.ps.server import parameter_server
from dtemu.core.ps.spec import PS, SS
from dtemu.core.ps.state_server import state_server
from dtemu.core.ps.worker import ps_worker
from dtemu.core.wire.topics import (CLIENT_UPDATE, COLL_FRAMES, GEO_PULL, GEO_PUSH, MODEL_BLOB, PS_MODEL, PS_UPDATE,
                                    SS_REPLY, SS_STATE, TRAIN_CMD)


@dataclass(frozen=True)
class RoleSpec:
    rank: int
    name: str
    subscribes: tuple[str, ...]
    publishes: tuple[str, ...]
    # start(ctx, init): the role's generator; init the checkpoint bytes to resume from, or None
    start: Callable[[Any, bytes | None], Any]


def role_of(scenario: Scenario, rank: int, work: Workload, key: bytes | None = None,
            population: Population | None = None, residuals: Residuals | None = None) -> RoleSpec:
    """The role of ``rank``; ``key`` seals FL messages (core.wire.auth); ``population``: the FL
    controller's availability and sampling (a trace's windows, read by the host); ``residuals``:
    the FL clients' error-feedback residuals, bounded in memory (core.fl.residuals)."""
    # FL names without building the list of every node (once per rank: quadratic at 10,000 clients)
    name = (CONTROLLER if rank == 0 else f"client{rank}") if scenario.mode == "fl" else scenario.node_names[rank]
    if scenario.mode == "ddp":
        return RoleSpec(rank, name, (COLL_FRAMES,), (COLL_FRAMES,),
                        lambda ctx, init: worker(ctx, scenario, work, rank))
    if scenario.mode == "ps":
        return ps_role(scenario, rank, name, work)
    if scenario.mode == "geo":
        return geo_role(scenario, rank, name, work)
    if name == CONTROLLER:
        return RoleSpec(rank, name, (CLIENT_UPDATE,), (TRAIN_CMD, MODEL_BLOB),
                        lambda ctx, init: controller(ctx, scenario, work, init, key, population))
    return RoleSpec(rank, name, (TRAIN_CMD, MODEL_BLOB), (CLIENT_UPDATE,),
                    lambda ctx, init: client(ctx, scenario, work, rank, key, residuals))


def geo_role(scenario: Scenario, rank: int, name: str, work: Workload) -> RoleSpec:
    """geo: the master and the root PS (global or flat) in the central site; local PSs and workers."""
    if name == MASTER:
        return RoleSpec(rank, name, (GEO_PULL,), (GEO_PUSH,), lambda ctx, init: geo.master(ctx, scenario, work, name))
    if name in (GLOBAL_PS, FLAT_PS):
        return RoleSpec(rank, name, (GEO_PUSH,), (GEO_PULL,), lambda ctx, init: geo.root_ps(ctx, scenario, work, name))
    if name in scenario.training_nodes:
        return RoleSpec(rank, name, (GEO_PULL,), (GEO_PUSH,), lambda ctx, init: geo.worker(ctx, scenario, work, name))
    return RoleSpec(rank, name, (GEO_PUSH, GEO_PULL), (GEO_PUSH, GEO_PULL),
                    lambda ctx, init: geo.local_ps(ctx, scenario, work, name))


def ps_role(scenario: Scenario, rank: int, name: str, work: Workload) -> RoleSpec:
    """ps: rank 0 the parameter server, rank 1 the state server, ranks 2.. the workers."""
    if name == PS:
        return RoleSpec(rank, name, (PS_UPDATE,), (PS_MODEL, SS_STATE),
                        lambda ctx, init: parameter_server(ctx, scenario, work, init))
    if name == SS:
        workers = list(range(2, 2 + scenario.ps.workers))
        return RoleSpec(rank, name, (SS_STATE,), (SS_REPLY,),
                        lambda ctx, init: state_server(ctx, scenario.node_names, workers,
                                                       needed=scenario.ps.uses_state_server))
    return RoleSpec(rank, name, (PS_MODEL, SS_REPLY), (PS_UPDATE, SS_STATE),
                    lambda ctx, init: ps_worker(ctx, scenario, work, rank))


def readers_of(scenario: Scenario) -> dict[str, frozenset[str]] | None:
    """Which nodes read each topic, where not every peer reads every topic a node publishes
    (mode ps: the state server reads none of the models; geo: the root PS reads no pull, workers
    and the master no push); None: they all do."""
    if scenario.mode == "geo":
        by_topic: dict[str, set[str]] = {GEO_PUSH: set(), GEO_PULL: set()}
        for rank, name in enumerate(scenario.node_names):
            for topic in geo_role(scenario, rank, name, None).subscribes:
                by_topic[topic].add(name)
        return {t: frozenset(names) for t, names in by_topic.items()}
    if scenario.mode != "ps":
        return None
    workers = frozenset(scenario.ps.worker_names)
    return {PS_MODEL: workers, SS_REPLY: workers, PS_UPDATE: frozenset({PS}), SS_STATE: frozenset({SS})}


def roles(scenario: Scenario, work: Workload, key: bytes | None = None,
          population: Population | None = None, residuals: Residuals | None = None) -> list[RoleSpec]:
    return [role_of(scenario, rank, work, key, population, residuals) for rank in range(len(scenario.node_names))]
