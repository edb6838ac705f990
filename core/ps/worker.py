"""A worker of mode ps (ESync's Algorithm 3, and the baselines' workers).

It joins (JOIN: the server answers with the current model), then per round:
takes w^r as its base, measures m_k (the model's transfer time, as the time one
update to the server takes on a symmetric link), REPORTs the new round to the
state server (esync), and runs local iterations: under ESync it asks the state
server after each one (QUERY -> TRAIN or SYNC; no answer within
``ps.query_timeout_s`` counts as SYNC), otherwise it runs the algorithm's count
(``strategies.local_iterations``).  On SYNC it pushes delta = w - w^r and waits
for a newer model; the time it waits, less that model's own transfer, is its
blocking time d_wait.  c_k is the runtime clock's time of the last iteration
(virtual in emu, wall in real), so real mode's counts follow the speeds measured.

A newer model that arrives while it trains (FedDrop closed the round without
it; a restarted worker) ends the round's work: what it did is dropped.  The same
version arriving again after a push means the server lost the update (it
restarted): the update goes again.  Anything that does not decode is counted and
dropped.  An update that is not finite (training diverged) is not sent: a NOT_FINITE
report goes instead, and the worker waits for a model again, the same version
included (an asynchronous server answers with its current model, which may be the
one it trained on; a server that finds the model diverged sends STOP).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from dtemu.core import events as ev
from dtemu.core.errors import DecodeError
from dtemu.core.ml.params import flatten, load_flat
from dtemu.core.fl.esync import Questions
from dtemu.core.ml.batches import step_seed
from dtemu.core.ml.jobs import take_step
from dtemu.core.ml.task import training_error
from dtemu.core.ml.train import sgd_iteration
from dtemu.core.ps import messages as pm
from dtemu.core.ps.local import BatchStream
from dtemu.core.ps.spec import PS, SS
from dtemu.core.ps.strategies import local_iterations
from dtemu.core.runtime import points
from dtemu.core.runtime.requests import Compute, Point, Recv, Send, WaitPeers
from dtemu.core.wire.topics import PS_MODEL, PS_UPDATE
from dtemu.core.runtime.refusal import refuse


@dataclass
class WorkerResult:
    rounds: int = 0  # updates pushed
    iterations: int = 0  # local iterations, in all
    per_round: list = field(default_factory=list)  # local iterations of each pushed update
    samples: int = 0
    compute_s: float = 0.0
    blocking_s: float = 0.0
    dropped_rounds: int = 0  # work a newer model overtook
    query_timeouts: int = 0
    not_finite: int = 0  # updates that came out not finite (reported, not sent)
    rejected: Counter = field(default_factory=Counter)


class _Worker:
    def __init__(self, ctx, scenario, work, rank: int):
        self.ctx, self.ps, self.work = ctx, scenario.ps, work
        self.rank = rank
        index = rank - 2  # worker1 is rank 2 and holds partition 0
        self.stream = BatchStream(work.partitions[index], self.ps.batch_size, scenario.seed, rank)
        self.plan = local_iterations(self.ps, self.stream.per_epoch)
        self.model = work.new_model()
        make = getattr(getattr(work, "task", None), "optimizer", None) or torch.optim.SGD  # a task may bring its own
        self.opt = make(self.model.parameters(), lr=self.ps.lr, momentum=0.0, weight_decay=0.0)
        self.pending: pm.Model | None = None  # a newer model that arrived meanwhile
        # Models older than this are ignored: the version being trained + 1, or, once its update
        # is pushed, that version itself (the server restarted and publishes it again).
        self.floor = 0
        self.stop = False
        self.out = WorkerResult()
        # ESync's questions, and c_k, m_k as it measured them (core.fl.esync, as FL's clients ask)
        self.q = Questions(ctx, rank, scenario.node_names.index(SS), self.ps.query_timeout_s, self.out.rejected)
        self.blocked_since_push = 0.0   # for the next ps_worker_round event

    def take(self, msg) -> None:
        """Keep the newest model (or Stop) from one message of the server."""
        try:
            m = pm.decode_ps(self.ctx.open(msg), self.work.dim)
            if msg.src != PS or not isinstance(m, (pm.Model, pm.PsStop)):
                raise DecodeError(f"{type(m).__name__} from {msg.src!r}")
        except DecodeError as err:
            self.refuse(msg, err)
            return
        if isinstance(m, pm.PsStop):
            self.stop = True
        elif m.version >= self.floor and (self.pending is None or m.version >= self.pending.version):
            self.pending = m
            self.q.m = max(0.0, msg.received_at - msg.sent_at)

    def poll(self):
        """Take whatever the server sent, without waiting."""
        while True:
            msg = yield Recv((PS_MODEL,), deadline=self.ctx.now())
            if msg is None:
                return
            self.take(msg)

    def refuse(self, msg, err: Exception) -> None:
        """Count, charge and log a message refused (an AuthError says its own reason)."""
        reason = getattr(err, "reason", "malformed")
        refuse(self.ctx, self.out.rejected, msg, reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src,
               reason=reason, error=str(err))

    def push(self, data: bytes, version: int) -> Send:
        """An update (or join, or not-finite report) to the server, sealed under the run's key."""
        return Send(PS_UPDATE, self.ctx.seal(PS_UPDATE, max(version, 0), data), to=PS)


def ps_worker(ctx, scenario, work, rank: int):
    w = _Worker(ctx, scenario, work, rank)
    ps = w.ps
    adaptive = w.plan is None
    peers = (PS, SS) if adaptive else (PS,)
    yield WaitPeers(peers, deadline=ctx.now() + ps.barrier_timeout_s)
    yield w.push(pm.encode_ps(pm.Join(rank)), 0)
    last_push: tuple[int, bytes] | None = None
    version = -1
    while not w.stop:
        # Wait for a model newer than the one we trained on (or the same again: our update was lost).
        waited_from = ctx.now()
        while not w.stop and w.pending is None:
            msg = yield Recv((PS_MODEL,))
            w.take(msg)
        if w.stop:
            break
        model, w.pending = w.pending, None
        w.floor = model.version + 1
        if last_push is not None and model.version == version:
            yield w.push(last_push[1], version)  # the server restarted without it (sealed anew: not a replay)
            ctx.emit(ev.UPDATE_RESENT, round=version, bytes=len(last_push[1]))
            last_push = None
            continue
        if last_push is not None:
            blocked = max(0.0, ctx.now() - waited_from - w.q.m)
            w.out.blocking_s += blocked
            w.blocked_since_push += blocked
        last_push = None
        version = model.version
        if model.selected and rank not in model.selected:
            continue  # not chosen this round (TiFL): wait for the next model
        base = model.weights
        load_flat(w.model, base)
        i, loss_sum, samples = 0, 0.0, 0
        if adaptive:
            yield w.q.report(version)
        overtaken = failed = False
        while True:
            if not adaptive:
                action = pm.TRAIN if i < w.plan else pm.SYNC
            elif i == 0:
                action = pm.TRAIN
            elif w.ps.max_local_iterations is not None and i >= w.ps.max_local_iterations:
                action = pm.SYNC   # the cap: no question to ask
            else:
                action = yield from w.q.ask(i, version)
            if action == pm.SYNC:
                break
            batch = w.stream.next()
            seed = step_seed(scenario.seed, rank, w.out.iterations)
            yield Point(points.TRAIN, version)
            started = ctx.now()
            try:
                # here, in the worker's model, or (emu --jobs N) in a worker process on its state
                job = work.step_job(w.model, batch, seed, ps.lr) if hasattr(work, "step_job") else None
                loss = take_step(w.model, (yield Compute(
                    lambda b=batch, s=seed: (sgd_iteration(w.model, w.opt, work.data.x_train, work.data.y_train,
                                                           b, s, work.task), None),
                    samples=len(batch), job=job)))
            except Exception as err:  # the task's own code raised: reported as a diverged update is
                ctx.emit(ev.TRAIN_FAILED, round=version, error=training_error(work, err))
                failed = True
                break
            w.q.c = ctx.now() - started
            w.out.compute_s += w.q.c
            w.out.iterations += 1
            i, loss_sum, samples = i + 1, loss_sum + loss * len(batch), samples + len(batch)
            yield from w.poll()
            if w.stop or (w.pending is not None and w.pending.version > version):
                overtaken = True
                break
        if overtaken:
            w.out.dropped_rounds += 1
            continue
        delta = flatten(w.model) - base
        if failed or not np.isfinite(delta).all():
            if not failed:
                ctx.emit(ev.UPDATE_NOT_FINITE, round=version)
            yield w.push(pm.encode_ps(pm.NotFinite(version, rank, i)), version)
            w.floor = version  # the server's answer may be this version again: train on it anew
            w.out.not_finite += 1
            continue
        data = pm.encode_ps(pm.Update(version, rank, i, samples, loss_sum / max(samples, 1), delta))
        yield Point(points.UPLOAD, version)
        yield w.push(data, version)
        last_push = (version, data)
        w.floor = version
        w.out.rounds += 1
        w.out.per_round.append(i)
        w.out.samples += samples
        ctx.emit(ev.PS_WORKER_ROUND, round=version, iterations=i, samples=samples,
                 compute_s=round(w.out.compute_s, 9), c=round(w.q.c, 9), m=round(w.q.m, 9),
                 blocked_s=round(w.blocked_since_push, 9))
        w.blocked_since_push = 0.0
    w.out.query_timeouts = w.q.timeouts
    ctx.emit(ev.CLIENT_STOP, round=version, reason="stop", rejected=dict(w.out.rejected))
    return w.out
