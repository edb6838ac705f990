"""The data-parallel worker, written once for both runtimes.

Each step: forward/backward on this rank's batch, exchange gradients with the
other ranks (a dense allreduce, or DGC's sparse allgather), average them, take
the optimizer step.  Every step is profiled — bytes sent and received, compute,
compression, sending and the pure wait for the others — and reported per step
and per window of ``ddp.window`` steps (mean and max).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..collectives import Collective, FrameError
from ..params import flatten, sha256_of
from ..runtime import Compute
from ..scenario import Scenario
from ..workload import Workload
from .exchange import make_exchange

PROFILE_KEYS = ("bytes_sent", "bytes_received", "compute_s", "compress_s", "send_s", "wait_s", "comm_s")


@dataclass
class WorkerResult:
    weights: np.ndarray
    steps: int = 0
    final_accuracy: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    counts: dict = field(default_factory=dict)


class _Window:
    """Mean and max of the profile over the last ``size`` steps."""

    def __init__(self, size: int):
        self.size = size
        self.rows: list[dict] = []

    def add(self, row: dict) -> dict | None:
        self.rows.append(row)
        if len(self.rows) < self.size:
            return None
        return self.flush()

    def flush(self) -> dict | None:
        if not self.rows:
            return None
        out = {"steps": len(self.rows), "first_step": self.rows[0]["step"]}
        for key in PROFILE_KEYS:
            values = [r[key] for r in self.rows]
            out[f"{key}_mean"] = round(float(np.mean(values)), 9)
            out[f"{key}_max"] = round(float(np.max(values)), 9)
        self.rows = []
        return out


def worker(ctx, scenario: Scenario, work: Workload, rank: int):
    d = scenario.ddp
    peers = scenario.worker_names
    coll = Collective(ctx, rank, peers, frame_bytes=d.frame_bytes, max_payload=64 * work.dim + (1 << 20))
    model = work.new_model()
    exchange = make_exchange(scenario, model, rank, len(peers), work.steps_per_epoch)
    result = WorkerResult(weights=np.empty(0, np.float32))
    ctx.emit("worker_start", rank=rank, world=len(peers), dim=work.dim,
             steps_per_epoch=work.steps_per_epoch, compression=d.compression)
    yield from coll.barrier(ctx.now() + d.barrier_timeout_s)
    ctx.emit("barrier", matched=peers)

    window = _Window(d.window)
    step = 0
    total_steps = d.epochs * work.steps_per_epoch
    if d.max_steps is not None:
        total_steps = min(total_steps, d.max_steps)
    for epoch in range(d.epochs):
        for batch in work.worker_batches(rank, epoch):
            if step >= total_steps:
                break
            t0 = ctx.now()
            loss = yield Compute(lambda b=batch, s=step: work.gradients(model, b, rank, s), samples=len(batch))
            t1 = ctx.now()
            payload = yield Compute(lambda s=step: exchange.compress(s), kind="compress")
            t2 = ctx.now()
            received_before = coll.bytes_received
            yield from exchange.send(coll, step, payload)
            t3 = ctx.now()
            yield from exchange.wait(coll, step, t3 + d.step_timeout_s)
            t4 = ctx.now()
            yield Compute(lambda s=step: exchange.apply(coll, s), kind="compress")
            row = {
                "step": step,
                "bytes_sent": exchange.sent,
                "bytes_received": coll.bytes_received - received_before,
                "compute_s": round(t1 - t0, 9),
                "compress_s": round(t2 - t1 + ctx.now() - t4, 9),
                "send_s": round(t3 - t2, 9),
                "wait_s": round(t4 - t3, 9),
                "comm_s": round(t4 - t2, 9),
            }
            result.bytes_sent += row["bytes_sent"]
            result.bytes_received += row["bytes_received"]
            ctx.emit("step", epoch=epoch, loss=round(loss, 6), density=exchange.density(step), **row)
            summary = window.add(row)
            if summary:
                ctx.emit("window", epoch=epoch, **summary)
            step += 1
        last = epoch == d.epochs - 1 or step >= total_steps
        if (epoch + 1) % d.eval_every_epochs == 0 or last:
            accuracy = yield from _evaluate(ctx, coll, work, model, rank, len(peers), epoch, d.step_timeout_s)
            result.final_accuracy = accuracy
            ctx.emit("eval", epoch=epoch, step=step, accuracy=accuracy)
        if last:
            break
    summary = window.flush()
    if summary:
        ctx.emit("window", epoch=epoch, **summary)
    result.weights = flatten(model)
    result.steps = step
    result.counts = dict(coll.counts)
    ctx.emit("worker_end", steps=step, model_sha256=sha256_of(result.weights),
             bytes_sent=result.bytes_sent, bytes_received=result.bytes_received, counts=result.counts)
    return result


def _evaluate(ctx, coll: Collective, work: Workload, model, rank: int, world: int, epoch: int, timeout_s: float):
    """Every rank tests its share; the (correct, total) counts are allgathered."""
    correct, total = yield Compute(lambda: work.evaluate_shard(model, rank, world),
                                   samples=work.test_size // world, kind="eval")
    payloads = yield from coll.allgather(epoch, "eval", struct.pack("<QQ", correct, total),
                                         ctx.now() + timeout_s)
    if any(len(p) != 16 for p in payloads):
        raise FrameError("an evaluation count payload is not 16 bytes")
    counts = np.array([struct.unpack("<QQ", p) for p in payloads])
    return float(counts[:, 0].sum() / counts[:, 1].sum())
