"""One emulated run of a scenario: build the world, run it, write the run folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

import simpy
import torch

from core.params import sha256_of
from core.roles.client import client
from core.roles.controller import controller
from core.rundir import RunDir
from core.runtime import CLIENT_UPDATE, MODEL_BLOB, TRAIN_CMD
from core.scenario import CONTROLLER, Scenario
from core.workload import Workload

from .compute import ComputeTimer
from .faults import DropoutFilter, schedule_offline
from .network import Network, link_from_spec
from .runtime import EmuNode, World


def build_world(env: simpy.Environment, scenario: Scenario, work: Workload, run: RunDir,
                init: bytes | None = None) -> World:
    links = {
        name: link_from_spec(link.up_mbps, link.down_mbps, link.latency_ms, link.loss)
        for name in scenario.node_names
        for link in [scenario.link(name)]
    }
    network = Network(env, links, seed=scenario.seed, mtu=scenario.network.mtu)
    world = World(env, network, run.event, run.save_checkpoint)
    world.delivery_filter = DropoutFilter(scenario, world.emit)
    for rank, name in enumerate(scenario.node_names):
        timer = ComputeTimer(scenario.compute_for(name), work.reference_cost, seed=[scenario.seed, rank])
        if name == CONTROLLER:
            make, topics = (lambda ctx: controller(ctx, scenario, work, init)), (CLIENT_UPDATE,)
        else:
            make, topics = (lambda ctx, i=rank: client(ctx, scenario, work, i)), (TRAIN_CMD, MODEL_BLOB)
        world.add(EmuNode(world, name, topics, make, timer))
    return world


def run_emulation(scenario: Scenario, out_dir: str | Path, init: bytes | None = None,
                  observers: Iterable[Callable[[dict], None]] = (), work: Workload | None = None) -> dict:
    """Run ``scenario`` in virtual time; returns the summary also written to ``out_dir``.

    ``work`` replaces the scenario's learning task (tests use a stand-in).
    """
    wall_start = time.perf_counter()
    torch.set_num_threads(scenario.threads)
    run = RunDir(out_dir)
    for fn in observers:
        run.observe(fn)
    try:
        run.write_json("scenario.json", scenario.to_dict())
        work = work or Workload(scenario)
        env = simpy.Environment()
        world = build_world(env, scenario, work, run, init)
        down = schedule_offline(world, scenario)
        for name in scenario.node_names:
            if name not in down:
                world.start(name)
        ctrl = world.nodes[CONTROLLER].process
        env.run(until=ctrl)
        result = ctrl.value
        summary = _summary(scenario, world, result, env.now, time.perf_counter() - wall_start)
        run.write_json("summary.json", summary)
        return summary
    finally:
        run.close()


def _summary(scenario: Scenario, world: World, result, sim_time: float, wall_time: float) -> dict:
    stats = world.network.stats
    clients = scenario.client_names
    return {
        "scenario": scenario.name,
        "runtime": "emu",
        "mode": scenario.mode,
        "codec": scenario.fl.codec,
        "seed": scenario.seed,
        "final_accuracy": result.final_accuracy,
        "rounds": result.rounds_completed,
        "rounds_failed": result.rounds_failed,
        "stop_reason": result.stop_reason,
        "bytes_up": sum(stats[c].bytes_sent for c in clients),
        "bytes_down": sum(stats[c].bytes_received for c in clients),
        "wire_bytes": sum(s.wire_bytes_sent for s in stats.values()),
        "updates": dict(sorted(result.counts.items())),
        "model_sha256": sha256_of(result.weights),
        "sim_time_s": round(sim_time, 9),
        "wall_time_s": round(wall_time, 3),
    }
