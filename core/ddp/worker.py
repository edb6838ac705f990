"""The data-parallel worker, written once for both runtimes.

Each step: forward/backward on this rank's batch, exchange gradients with the
other ranks (a dense allreduce, or DGC's sparse allgather), average them, take
the optimizer step.  Every step is profiled — bytes sent and received, compute,
compression, sending and the pure wait for the others — and reported per step
and per window of ``ddp.window`` steps (mean and max).

A worker lost mid-run (``ddp.on_worker_lost``).  Every wait has a deadline, so
a lost peer shows as a ``CollectiveTimeout`` naming the ranks it lacked; the
first survivor to time out tells the others (a control message that ends their
own waits at once, ``LossNotice``), so that nobody waits for its own timeout.

- ``stop``: the survivor broadcasts ``stop`` (the ranks it lacked), emits
  ``worker_lost`` (ranks, step, what it was waiting for) and returns a result
  with ``stop_reason`` and ``lost_ranks``; a survivor told so reports the same
  ranks (less itself and the teller, who are alive).
- ``continue``: a regroup into generation g+1.  Each survivor broadcasts
  ``alive`` and listens for the others' for ``step_timeout_s`` (less if every
  member answers); who answered is the new membership.  Survivors may be one
  step apart (the lost rank's last payload reached some and not others), so
  the lowest survivor, the leader, broadcasts its ``state`` — membership, step,
  weights, optimizer momentum — and everyone resumes from it, identical: the
  others drop what they did since.  A survivor that hears no leader within
  another ``step_timeout_s`` tries generation g+2 (at most ``workers`` times).
  Fewer than ``ddp.min_workers`` survivors stop as ``stop`` does (the leader
  says ``stop``).  The collectives then run among the members, averaging over
  them only, and each survivor keeps its own data shard; the test set is split
  among the members.  DGC's residuals stay local (``dgc_exchange.py``).
  Events: ``worker_lost`` and ``membership`` (generation, members, step, leader).
- A survivor that is not in the leader's membership (its ``alive`` came too
  late) stops, as ``excluded``.  A lost rank that comes back (a restarted
  process, emu's ``faults.offline`` with ``end_s``) does not rejoin: it starts
  from scratch at generation 0, whose frames the survivors ignore, and its
  barrier fails (``stop_reason`` "barrier: ...") — refused, never mixed in.

The agreement assumes crashes, not partitions: survivors that can all reach one
another notice a loss within one step of each other, well inside the window.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dtemu.core.ddp.collectives import Collective, CollectiveTimeout, FrameError, LossNotice
from dtemu.core.ml.params import flatten, sha256_of
from dtemu.core.runtime.requests import Compute
from dtemu.core.ml.workload import Workload
from dtemu.core.ddp.dgc_exchange import DGCExchange
from dtemu.core.ddp.exchange import DenseExchange, Exchange
from dtemu.core.ddp.regroup import BARRIER_STOP, Position, on_loss, ranks_text
from dtemu.core.ml.jobs import gradient_pass
from dtemu.core.ml.task import failed_gradients
from dtemu.core import events as ev

if TYPE_CHECKING:  # (an annotation only: the scenario imports the modes, which import the roles)
    from dtemu.core.scenario import Scenario

PROFILE_KEYS = ("bytes_sent", "bytes_received", "compute_s", "compress_s", "send_s", "wait_s", "comm_s")


@dataclass
class WorkerResult:
    weights: np.ndarray
    steps: int = 0
    final_accuracy: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    counts: dict = field(default_factory=dict)
    # After a loss: why this worker stopped (None: it finished), the ranks the group lost,
    # and the membership it ended in (generation 0: the original one).
    stop_reason: str | None = None
    lost_ranks: list[int] = field(default_factory=list)
    members: list[int] = field(default_factory=list)
    generation: int = 0
    history: list = field(default_factory=list)  # (time, accuracy) of every evaluation


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
    ctx.emit(ev.WORKER_START, rank=rank, world=len(peers), dim=work.dim,
             steps_per_epoch=work.steps_per_epoch, compression=d.compression)
    try:
        yield from coll.barrier(ctx.now() + d.barrier_timeout_s)
    except (CollectiveTimeout, LossNotice) as err:
        # A peer missing at the start, or (a restarted rank) a group that has moved on.
        missing = err.missing
        ctx.emit(ev.BARRIER_FAILED, missing=missing, error=str(err))
        result.stop_reason = f"{BARRIER_STOP}: {ranks_text(missing)} missing ({err})"
        result.lost_ranks = list(missing)
        return _finish(ctx, coll, model, result, 0)
    ctx.emit(ev.BARRIER, matched=peers)

    spe = work.steps_per_epoch
    total_steps = d.epochs * spe
    if d.max_steps is not None:
        total_steps = min(total_steps, d.max_steps)
    pos = Position(eval_due=total_steps == 0)
    window = _Window(d.window)
    batches: dict[int, list] = {}
    while pos.step < total_steps or pos.eval_due:
        try:
            if pos.eval_due:
                epoch = pos.epoch(spe)
                accuracy = yield from _evaluate(ctx, coll, work, model, rank, epoch, d.step_timeout_s)
                result.final_accuracy = accuracy
                result.history.append((ctx.now(), accuracy))
                ctx.emit(ev.EVAL, epoch=epoch, step=pos.step, accuracy=accuracy)
                pos.eval_due = False
                continue
            epoch, i = divmod(pos.step, spe)
            if epoch not in batches:
                batches = {epoch: work.worker_batches(rank, epoch)}
            row = yield from _step(ctx, d, coll, exchange, work, model, rank, pos.step, batches[epoch][i])
            result.bytes_sent += row["bytes_sent"]
            result.bytes_received += row["bytes_received"]
            summary = window.add(row)
            if summary:
                ctx.emit(ev.WINDOW, epoch=epoch, **summary)
            pos.step += 1
            if pos.step % spe == 0 or pos.step >= total_steps:  # the end of an epoch
                last = epoch == d.epochs - 1 or pos.step >= total_steps
                pos.eval_due = (epoch + 1) % d.eval_every_epochs == 0 or last
        except (CollectiveTimeout, LossNotice) as err:
            stop = yield from on_loss(ctx, d, coll, exchange, model, pos, rank, err, result)
            if stop is not None:
                result.stop_reason = stop
                break
    summary = window.flush()
    if summary:
        ctx.emit(ev.WINDOW, epoch=pos.epoch(spe), **summary)
    return _finish(ctx, coll, model, result, pos.step)


def _step(ctx, d, coll: Collective, exchange, work: Workload, model, rank: int, step: int, batch):
    """One training step; its profile row.  Nothing changes if a wait fails."""
    epoch = step // work.steps_per_epoch
    t0 = ctx.now()
    try:
        loss = yield from gradient_pass(work, model, batch, rank, step)   # (here, or in a worker process)
    except Exception as err:  # the task's own code raised: this step's share is zero, the run goes on
        loss = failed_gradients(ctx, work, model, err, step)
    t1 = ctx.now()
    # Both ops are priced per MB of the fp32 gradient in emu (compute.*.cpu.encode_s_per_mb,
    # apply_s_per_mb, which `emu calibrate` measures for the exchange); free where unpriced.
    grad_bytes = 4 * work.dim
    payload = yield Compute(lambda: exchange.compress(step), kind="encode", nbytes=grad_bytes)
    t2 = ctx.now()
    received_before = coll.bytes_received
    yield from exchange.send(coll, step, payload)
    t3 = ctx.now()
    yield from exchange.wait(coll, step, t3 + d.step_timeout_s)
    t4 = ctx.now()
    yield Compute(lambda: exchange.apply(coll, step), kind="apply", nbytes=grad_bytes)
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
    ctx.emit(ev.STEP, epoch=epoch, loss=round(loss, 6), density=exchange.density(step), **row)
    return row


def _finish(ctx, coll: Collective, model, result: WorkerResult, steps: int) -> WorkerResult:
    result.weights = flatten(model)
    result.steps = steps
    result.counts = dict(coll.counts)
    result.members = list(coll.members)
    result.generation = coll.group
    extra = {}
    if result.stop_reason is not None or result.lost_ranks:
        extra = {"stop_reason": result.stop_reason, "lost_ranks": result.lost_ranks,
                 "members": result.members, "generation": result.generation}
    ctx.emit(ev.WORKER_END, steps=steps, model_sha256=sha256_of(result.weights),
             bytes_sent=result.bytes_sent, bytes_received=result.bytes_received, counts=result.counts, **extra)
    return result


def _evaluate(ctx, coll: Collective, work: Workload, model, rank: int, epoch: int, timeout_s: float):
    """Every member tests its share; the (correct, total) counts are allgathered."""
    index, size = coll.members.index(rank), len(coll.members)
    correct, total = yield Compute(lambda: work.evaluate_shard(model, index, size),
                                   samples=work.test_size // size, kind="eval")
    payloads = yield from coll.allgather(epoch, "eval", struct.pack("<QQ", correct, total),
                                         ctx.now() + timeout_s)
    if any(len(p) != 16 for p in payloads):
        raise FrameError("an evaluation count payload is not 16 bytes")
    counts = np.array([struct.unpack("<QQ", p) for p in payloads])
    return float(counts[:, 0].sum() / counts[:, 1].sum())


def make_exchange(scenario: Scenario, model, rank: int, world: int, steps_per_epoch: int) -> Exchange:
    if scenario.ddp.compression == "dgc":
        return DGCExchange(scenario, model, rank, world, steps_per_epoch)
    return DenseExchange(scenario, model, rank, world)
