"""One rank of a scenario, for real: its transport, its role, its run folder."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

import torch

from dtemu.core.ddp.collectives import COLL_FRAMES
from dtemu.core.ml.params import sha256_of
from dtemu.core.fl.client import client
from dtemu.core.fl.controller import controller
from dtemu.core.ddp.worker import worker
from dtemu.host.rundir import RunDir
from dtemu.core.runtime.requests import CLIENT_UPDATE, MODEL_BLOB, TRAIN_CMD
from dtemu.core.scenario import CONTROLLER, Scenario
from dtemu.core.ml.workload import Workload

from dtemu.real.runtime import RealNode
from dtemu.real.transport import DdsTransport


def _role(scenario: Scenario, rank: int, work: Workload, init: bytes | None, key: bytes | None):
    """(make_role, subscribes, publishes) of this rank."""
    if scenario.mode == "ddp":
        return (lambda ctx: worker(ctx, scenario, work, rank)), (COLL_FRAMES,), (COLL_FRAMES,)
    if scenario.node_names[rank] == CONTROLLER:
        return (lambda ctx: controller(ctx, scenario, work, init, key)), (CLIENT_UPDATE,), (TRAIN_CMD, MODEL_BLOB)
    return (lambda ctx: client(ctx, scenario, work, rank, key)), (TRAIN_CMD, MODEL_BLOB), (CLIENT_UPDATE,)


def run_node(scenario: Scenario, rank: int, out: str | Path, *, init: bytes | None = None,
             domain_id: int | None = None, profile: str = "loopback", threads: int | None = None,
             observers: Iterable[Callable[[dict], None]] = (), key: bytes | None = None,
             fired: Iterable[int] = (), append: bool = False) -> dict:
    """``key`` seals FL messages (core.auth); ``fired``: the faults.crashes this
    rank already went through (a restarted rank), ``append``: keep its events."""
    wall_start = time.perf_counter()
    torch.set_num_threads(threads or scenario.threads)
    name = scenario.node_names[rank]
    run = RunDir(out, append=append)
    for fn in observers:
        run.observe(fn)
    try:
        run.write_json("scenario.json", scenario.to_dict())
        work = Workload(scenario)
        work.dataset, work.partitions  # load before joining: the barrier should not wait for disk
        # The first torch optimizer imports torch._dynamo (1-4 s): do it now, or it lands in the
        # first round's training time (against round_timeout_s, and times a staged slowdown).
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        make_role, subscribes, publishes = _role(scenario, rank, work, init, key)
        with DdsTransport(name, profile=profile, domain_id=domain_id, subscribe=list(subscribes)) as transport:
            epoch = os.environ.get("DTEMU_EPOCH")  # set by `real launch`: one time origin for all ranks
            node = RealNode(name, transport, run, publishes, compute=scenario.compute_for(name),
                            epoch=float(epoch) if epoch else None,
                            seed=scenario.seed * 1000 + rank, faults=scenario.faults, fired=fired,
                            rank=rank, scenario_seed=scenario.seed)
            node.emit("node_up")
            result = node.drive(make_role(node))
            # Let what we sent last (the final model, Stop, the last frames) reach the peers.
            transport.flush(timeout_s=5.0)
            stats = dict(transport.stats)
        summary = _summary(scenario, name, node, result, time.perf_counter() - wall_start, stats)
        run.write_json("summary.json", summary)
        return summary
    finally:
        run.close()


def _summary(scenario: Scenario, name: str, node: RealNode, result, wall: float, stats: dict) -> dict:
    base = {"scenario": scenario.name, "runtime": "real", "mode": scenario.mode, "node": name,
            "seed": scenario.seed, "bytes_sent": node.bytes_sent, "bytes_received": node.bytes_received,
            "transport": {k: v for k, v in stats.items() if isinstance(v, (int, float))},
            "wall_time_s": round(wall, 3)}
    if scenario.mode == "ddp":
        return {**base, "compression": scenario.ddp.compression, "workers": scenario.ddp.workers,
                "final_accuracy": result.final_accuracy, "steps": result.steps,
                # What the steps' exchanges sent (no barrier, no evaluation), as emu's bytes_per_step counts.
                "step_bytes_sent": result.bytes_sent,
                "model_sha256": sha256_of(result.weights),
                # After a loss (ddp.on_worker_lost): why this rank stopped (None: it finished),
                # the ranks lost, the membership it ended in; `real run` exits 5 on a stop.
                "stop_reason": result.stop_reason, "lost_ranks": result.lost_ranks,
                "members": result.members, "generation": result.generation}
    if name == CONTROLLER:
        # The controller's view of the traffic: what the clients sent it, what it sent them.
        return {**base, "codec": scenario.fl.codec, "final_accuracy": result.final_accuracy,
                "rounds": result.rounds_completed, "rounds_failed": result.rounds_failed,
                "stop_reason": result.stop_reason, "bytes_up": node.bytes_received,
                "bytes_down": node.bytes_sent, "updates": dict(sorted(result.counts.items())),
                "model_sha256": sha256_of(result.weights)}
    return {**base, "model_round": result}
