"""One emulated run of a scenario: build the world, run it, write the run folder."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

import simpy
import torch

from dtemu.core.errors import DtemuError
from dtemu.core.ml.params import sha256_of
from dtemu.core.fl.client import client
from dtemu.core.ddp.collectives import COLL_FRAMES
from dtemu.core.fl.controller import controller
from dtemu.core.ddp.worker import worker
from dtemu.host.rundir import RunDir
from dtemu.core.runtime.requests import CLIENT_UPDATE, MODEL_BLOB, TRAIN_CMD
from dtemu.core.scenario import CONTROLLER, Scenario
from dtemu.core.ml.workload import Workload

from dtemu.core.runtime.compute import ComputeTimer
from dtemu.emu.faults import DropoutFilter, schedule_offline, schedule_partitions
from dtemu.emu.network import Network, link_from_spec
from dtemu.emu.runtime import EmuNode, World


def build_world(env: simpy.Environment, scenario: Scenario, work: Workload, run: RunDir,
                init: bytes | None = None, key: bytes | None = None) -> World:
    links = {
        name: link_from_spec(link.up_mbps, link.down_mbps, link.latency_ms, link.loss)
        for name in scenario.node_names
        for link in [scenario.link(name)]
    }
    network = Network(env, links, seed=scenario.seed, mtu=scenario.network.mtu)
    world = World(env, network, run.event, run.save_checkpoint, faults=scenario.faults, seed=scenario.seed)
    world.delivery_filter = DropoutFilter(scenario, world.emit)
    for rank, name in enumerate(scenario.node_names):
        timer = ComputeTimer(scenario.compute_for(name), work.reference_cost, seed=[scenario.seed, rank])
        if scenario.mode == "ddp":
            make, topics = (lambda ctx, r=rank: worker(ctx, scenario, work, r)), (COLL_FRAMES,)
        elif name == CONTROLLER:
            # A restarted controller resumes from its latest checkpoint, as `real` does with init_path.
            make = lambda ctx: controller(ctx, scenario, work, world.last_checkpoint or init, key)  # noqa: E731
            topics = (CLIENT_UPDATE,)
        else:
            make, topics = (lambda ctx, i=rank: client(ctx, scenario, work, i, key)), (TRAIN_CMD, MODEL_BLOB)
        world.add(EmuNode(world, name, topics, make, timer))
    return world


def run_emulation(scenario: Scenario, out_dir: str | Path, init: bytes | None = None,
                  observers: Iterable[Callable[[dict], None]] = (), work: Workload | None = None,
                  key: bytes | None = None) -> dict:
    """Run ``scenario`` in virtual time; returns the summary also written to ``out_dir``.

    ``work`` replaces the scenario's learning task (tests use a stand-in);
    ``key`` seals every FL message (core.auth).
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
        world = build_world(env, scenario, work, run, init, key)
        down = schedule_offline(world, scenario)
        schedule_partitions(world, scenario)
        for name in scenario.node_names:
            if name not in down:
                world.start(name)
        if scenario.mode == "ddp":
            # Until every worker's role returned or its node crashed (a crashed worker's
            # process ends with None; the survivors stop or go on without it, never hang).
            # A worker down from the start joins when it comes up; one that comes back
            # after a crash starts from scratch and is not waited for (it cannot rejoin).
            procs = {n: world.nodes[n].process for n in scenario.node_names if n not in down}
            env.run(until=env.all_of(list(procs.values())))
            for n in scenario.node_names:
                late = world.nodes[n].process
                if n in down and late is not None:
                    env.run(until=late)
                    procs[n] = late
            results = [procs[n].value if n in procs else None for n in scenario.node_names]
            summary = _ddp_summary(scenario, world, results, env.now, time.perf_counter() - wall_start)
        else:
            # Until the controller's role returns (it may crash and restart on the way),
            # then let what is still in flight land (the last model, Stop), as it would
            # for real; clients exit on Stop, so the event queue runs dry.
            done = world.nodes[CONTROLLER].finished
            try:
                env.run(until=done)
            except RuntimeError:
                if done.triggered:
                    raise
                raise DtemuError(f"the controller stopped at t={env.now:g} s without finishing the run "
                                 "(it crashed and was not restarted); nothing is left to happen") from None
            end = env.now
            env.run()
            summary = _summary(scenario, world, done.value, end, time.perf_counter() - wall_start)
        run.write_json("summary.json", summary)
        return summary
    finally:
        run.close()


def _traffic(scenario: Scenario, world: World) -> dict:
    stats = world.network.stats
    nodes = scenario.training_nodes
    return {
        "bytes_up": sum(stats[n].bytes_sent for n in nodes),
        "bytes_down": sum(stats[n].bytes_received for n in nodes),
        "wire_bytes": sum(s.wire_bytes_sent for s in stats.values()),
    }


def _ddp_summary(scenario: Scenario, world: World, results, sim_time: float, wall_time: float) -> dict:
    """The run's numbers, from the workers that were still there at the end.

    A crashed worker's process returns None.  After a loss: ``stop_reason``
    (None if the survivors finished), ``lost_ranks`` (what the survivors lost),
    ``survivors``, and ``steps`` the steps every survivor completed.
    """
    alive = [(rank, r) for rank, r in enumerate(results) if r is not None]
    survivors = [r for _, r in alive]
    hashes = sorted({sha256_of(r.weights) for r in survivors})
    steps = min((r.steps for r in survivors), default=0)
    reasons = [r.stop_reason for r in survivors if r.stop_reason]
    lost = sorted({k for r in survivors for k in r.lost_ranks} - {rank for rank, _ in alive}
                  | {rank for rank, r in enumerate(results) if r is None})
    return {
        "scenario": scenario.name,
        "runtime": "emu",
        "mode": "ddp",
        "compression": scenario.ddp.compression,
        "workers": scenario.ddp.workers,
        "seed": scenario.seed,
        "final_accuracy": survivors[0].final_accuracy if survivors else None,
        "steps": steps,
        **_traffic(scenario, world),
        "bytes_per_step": round(sum(r.bytes_sent for r in survivors) / max(steps, 1) / max(len(survivors), 1), 3),
        "model_sha256": hashes[0] if hashes else None,
        "models_agree": len(hashes) == 1,
        "stop_reason": reasons[0] if reasons else None,
        "lost_ranks": lost,
        "survivors": [rank for rank, _ in alive],
        "sim_time_s": round(sim_time, 9),
        "wall_time_s": round(wall_time, 3),
    }


def _summary(scenario: Scenario, world: World, result, sim_time: float, wall_time: float) -> dict:
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
        **_traffic(scenario, world),
        "updates": dict(sorted(result.counts.items())),
        "model_sha256": sha256_of(result.weights),
        "sim_time_s": round(sim_time, 9),
        "wall_time_s": round(wall_time, 3),
    }
