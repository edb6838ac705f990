"""What a controller does around an update rule, the same under synchronous rounds (core.fl.controller)
and fedasync's one update at a time (core.fl.fedasync): log an update taken or refused, save a
checkpoint, send the model down, evaluate."""

from __future__ import annotations

import numpy as np

from dtemu.core import events as ev
from dtemu.core.compression import codecs
from dtemu.core.runtime.verdict import LATE, Verdict
from dtemu.core.runtime import points
from dtemu.core.runtime.refusal import refuse
from dtemu.core.errors import BarrierTimeout
from dtemu.core.ml.params import sha256_of
from dtemu.core.runtime.requests import Evaluate, Point, WaitPeers, cpu_work
from dtemu.core.wire import messages
from dtemu.core.wire.checkpoint import Checkpoint, encode_checkpoint
from dtemu.core.wire.messages import ModelBlob

FP32 = codecs.CodecParams("fp32")


def blob(round_: int, weights: np.ndarray) -> bytes:
    """The whole model of ``round_`` as it goes down (fp32)."""
    return messages.encode(ModelBlob.of(round_, codecs.encode(weights, FP32)))


# The controller's own CPU work, which emu prices where the scenario gives the controller's rates
# (``emu calibrate`` measures them: emu.federation_costs.fl_server_costs): the rule's aggregation is
# ``sum``, per MB of the fp32 updates it takes in; saving a checkpoint is ``encode``, per MB of the model's.

def aggregate(ctx, scenario, round_: int, rule, updates: list):
    """``rule()``: the new model from ``updates``, logged with its hash (its CPU: ``sum`` per update)."""
    weights = yield from cpu_work(scenario.compute_for(ctx.node).cpu, "sum",
                                  sum(4 * u.payload.dim for u in updates), rule)
    ctx.emit(ev.AGGREGATED, round=round_, model_sha256=sha256_of(weights))
    return weights


def checkpoint(ctx, scenario, result, round_: int, state: dict):
    """Save what a restarted controller resumes from after ``round_`` (``result``: its ControllerResult,
    whose tallies the checkpoint keeps too)."""
    extra = {"rounds_completed": result.rounds_completed, "rounds_failed": result.rounds_failed,
             "counts": dict(result.counts)}
    data = lambda: encode_checkpoint(Checkpoint(round_, result.weights, scenario.digest(), extra, state))
    where = yield from cpu_work(scenario.compute_for(ctx.node).cpu, "encode", result.weights.nbytes,
                                lambda: ctx.save_checkpoint(data()))
    ctx.emit(ev.CHECKPOINT, round=round_, path=where)
    yield Point(points.CHECKPOINTED, round_)


def out_of_time(ctx, fl) -> bool:
    """Has the run reached fl.max_time_s on the runtime's clock (then the round just done is its last)?"""
    return fl.max_time_s is not None and ctx.now() >= fl.max_time_s


def evaluate(fl, work, weights, round_: int, last: bool = False):
    """Evaluate after ``round_`` if fl.eval_every says so, and after the last (``last``: one that
    fl.max_time_s made the last)."""
    if round_ % fl.eval_every == 0 or round_ == fl.rounds or last:
        job = work.eval_job(weights) if hasattr(work, "eval_job") else None  # worker processes may share it
        yield Evaluate(lambda: work.evaluate(weights), round=round_, samples=work.test_size, job=job)


def accepted(ctx, counts, msg, verdict: Verdict, round_: int | None = None, **extra) -> None:
    """Count and log an update taken, as part of ``round_`` (None: the round its command named)."""
    up = verdict.message
    counts["accepted"] += 1
    ctx.emit(ev.UPDATE_ACCEPTED, client=up.client, round=up.round if round_ is None else round_, bytes=len(msg.data),
             num_samples=up.num_samples, sent_at=msg.sent_at, comm_s=msg.received_at - msg.sent_at, **extra)


def refuse_update(ctx, counts, msg, verdict: Verdict, current: int) -> None:
    """Count and log an update the inbox would not accept, with the fields its event has always had."""
    up, reason = verdict.message, verdict.reason
    if verdict.kind == LATE:
        refuse(ctx, counts, msg, "late", ev.UPDATE_LATE, client=up.client, round=up.round, current=current)
    elif up is None:  # not authentic, or not an update at all
        refuse(ctx, counts, msg, reason, ev.UPDATE_REJECTED, src=msg.src, reason=reason, error=verdict.error)
    elif reason == "rejected":  # decoded, but not a usable update (its packet, NaN, its norm)
        refuse(ctx, counts, msg, reason, ev.UPDATE_REJECTED, client=up.client, round=up.round, reason="invalid",
               error=verdict.error)
    else:  # duplicate, not_asked, unknown_sender
        refuse(ctx, counts, msg, reason, ev.UPDATE_REJECTED, client=up.client, round=up.round,
               reason=reason)


def barrier(ctx, fl, clients):
    """No command before every expected client is there (or enough, if fl.barrier_require allows).
    (The FL controller's and the Flower server's, core.flower.server.)"""
    t0 = ctx.now()
    matched = yield WaitPeers(clients, deadline=t0 + fl.barrier_timeout_s)
    missing = sorted(set(clients) - set(matched))
    ctx.emit(ev.BARRIER, matched=sorted(matched), missing=missing, waited_s=ctx.now() - t0)
    enough = len(matched) >= fl.min_clients and fl.barrier_require == "min_clients"
    if missing and not enough:
        raise BarrierTimeout(missing, fl.barrier_timeout_s)
