"""The parameter server role (ESync's Algorithm 2, and the baselines' servers).

Synchronous algorithms (esync, ssgd, fedavg, feddrop, tifl), per round r:
publish w^r to every worker (with the ranks chosen to train on it, TiFL), tell
the state server round r has begun (esync), collect updates until the strategy's
quorum is in or ``ps.round_timeout_s`` passed, then with at least
``ps.min_workers`` updates w^{r+1} = w^r + epsilon * sum_k (n_k/n) delta_k (the
strategy's ``aggregate``); workers that missed the deadline are declared gone to
the state server (LEAVE).  Asynchronous algorithms (asgd, dcasgd, fedasync): each
update is applied as it comes (the strategy's ``apply``) and the new model goes
back to its sender alone.

Every message is untrusted: what does not decode, comes from a node that is not
the worker it names, is for an older version (late: FedDrop's dropped updates),
a duplicate, or from a worker not chosen this round is counted and dropped.  A
JOIN (a worker that starts or restarts) is answered with the current model.
The server checkpoints (version, weights) after every round (asynchronous: at
every evaluation); a restarted server resumes from it and publishes the same
version again, and a worker whose update died with the old server sends it again.

Divergence.  A worker whose update is not finite sends NOT_FINITE instead (an
UPDATE whose vector is not finite counts the same): the server counts it
(``not_finite``), a synchronous round no longer waits for that worker, and an
asynchronous server answers with its current model so the worker goes on.  Once
K such reports (``ps.workers``) came about the current model since it last
changed, or a round's aggregate or an update's application would make the model
not finite (which is then not taken), or an evaluation's test loss is not finite
(the weights overflow the logits), the model has diverged: the run ends at once,
in both runtimes, with ``stop_reason`` "diverged: ..." and the last model taken as
its result.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from dtemu.core import events as ev
from dtemu.core.errors import DecodeError
from dtemu.core.ml.params import load_flat, sha256_of
from dtemu.core.fl.esync import Leader
from dtemu.core.ps import messages as pm
from dtemu.core.ps.inbox import worker_inbox
from dtemu.core.runtime.verdict import ACCEPTED, JOIN, NOT_FINITE
from dtemu.core.ps.local import evaluate_loss, xavier_weights
from dtemu.core.ps.spec import PS, SS
from dtemu.core.ps.strategies import make_strategy, weighed
from dtemu.core.runtime import points
from dtemu.core.runtime.collect import Quorum, collect
from dtemu.core.runtime.requests import Compute, Point, Send, WaitPeers, cpu_work
from dtemu.core.wire.topics import PS_MODEL
from dtemu.core.runtime.refusal import refuse


@dataclass
class ServerResult:
    weights: np.ndarray
    version: int = 0
    final_accuracy: float | None = None
    final_loss: float | None = None
    history: list = field(default_factory=list)  # (time, accuracy)
    rounds_failed: int = 0
    stop_reason: str = "done"
    counts: Counter = field(default_factory=Counter)  # updates: accepted, late, duplicate, malformed, ...


class _Server:
    """The state both loops share: the model, the peers, evaluation and refusals."""

    def __init__(self, ctx, scenario, work, init: bytes | None):
        self.ctx, self.scenario, self.work, self.ps = ctx, scenario, work, scenario.ps
        names = scenario.node_names
        self.rank_of = {n: r for r, n in enumerate(names)}
        self.name_of = dict(enumerate(names))
        self.ranks = [self.rank_of[w] for w in self.ps.worker_names]
        self.inbox = worker_inbox(ctx.sealer, work.dim, {r: self.name_of[r] for r in self.ranks})
        self.samples = {self.rank_of[w]: len(work.partitions[i]) for i, w in enumerate(self.ps.worker_names)}
        self.strategy = make_strategy(self.ps, self.ranks, scenario.seed)
        self.uses_ss = self.ps.uses_state_server
        self.cpu_costs = scenario.compute_for(ctx.node).cpu
        # what the rounds tell ESync's state server (core.fl.esync, as FL's controller tells it)
        self.ss = Leader(ctx, self.rank_of[PS], self.rank_of[SS])
        self.model = work.new_model()
        weights = (xavier_weights(self.model, scenario.seed) if self.ps.init == "xavier"
                   else work.initial_weights.copy())
        self.out = ServerResult(weights=weights)
        self.resumed = False
        if init is not None:
            try:
                saved = pm.decode_ps(init, work.dim)
            except DecodeError as err:
                raise DecodeError(f"the parameter server's checkpoint does not decode: {err}") from None
            if isinstance(saved, pm.Model):
                self.out.weights, self.out.version, self.resumed = saved.weights, saved.version, True
                ctx.emit(ev.RESUME, round=saved.version, model_sha256=sha256_of(saved.weights))
        self.last_eval_t = ctx.now()
        self.evaluated: int | None = None  # the version last evaluated
        self.not_finite_now = 0  # NOT_FINITE reports about the current model (since it last changed)
        self.diverged = False

    def time_up(self) -> bool:
        return self.ps.max_time_s is not None and self.ctx.now() >= self.ps.max_time_s

    def model_bytes(self, selected=()) -> bytes:
        return pm.encode_ps(pm.Model(self.out.version, self.out.weights, tuple(selected)))

    def send_model(self, data: bytes, to: str | None = None) -> Send:
        """``data`` (a model, or Stop) to the workers (or one), sealed under the run's key."""
        return Send(PS_MODEL, self.ctx.seal(PS_MODEL, self.out.version, data), to=to)

    # The server's own CPU work, which emu prices where the scenario gives the server's rates (as
    # FL's controller: core.fl.steps): its rule taking updates is ``sum``, per MB of the fp32
    # updates; saving a checkpoint is ``encode``, per MB of the model's.
    def cpu(self, op: str, nbytes: int, fn):
        return (yield from cpu_work(self.cpu_costs, op, nbytes, fn))

    def checkpoint(self):
        yield from self.cpu("encode", 4 * self.work.dim, lambda: self.ctx.save_checkpoint(self.model_bytes()))

    def refuse(self, msg, reason: str, error: str = "") -> None:
        refuse(self.ctx, self.out.counts, msg, reason, ev.UPDATE_REJECTED, reason=reason, src=msg.src, error=error)

    def not_finite(self, msg, m: pm.NotFinite) -> bool:
        """Count a worker's not-finite update; True when the model has diverged (K such reports about
        the current model since it last changed)."""
        self.out.counts["not_finite"] += 1
        self.ctx.emit(ev.UPDATE_REJECTED, reason="not_finite", src=msg.src, round=m.version,
                      error=f"its update from version {m.version} ({m.iterations} iterations) is not finite")
        if m.version == self.out.version:
            self.not_finite_now += 1
        if self.not_finite_now >= self.ps.workers:
            self.diverge(f"{self.not_finite_now} updates from version {self.out.version} were not finite")
        return self.diverged

    def take(self, weights: np.ndarray, what: str) -> bool:
        """Make ``weights`` the model if they are finite; else the model has diverged (it stays)."""
        if not np.isfinite(weights).all():
            self.diverge(f"{what} gives a model that is not finite")
            return False
        self.out.weights, self.not_finite_now = weights, 0
        return True

    def diverge(self, why: str) -> None:
        """The run ends; its stop_reason names the first sign (the final evaluation may show another)."""
        if not self.diverged:
            self.diverged = True
            self.out.stop_reason = f"diverged: {why}; the result is version {self.out.version}"

    def evaluate(self, force: bool = False):
        ps, now = self.ps, self.ctx.now()
        due = self.out.version % ps.eval_every == 0 or (
            ps.eval_every_s is not None and now - self.last_eval_t >= ps.eval_every_s)
        if not (due or force) or self.evaluated == self.out.version:
            return
        n = self.work.test_size
        x, y = self.work.data.x_test[:n], self.work.data.y_test[:n]

        def run():
            load_flat(self.model, self.out.weights)
            return evaluate_loss(self.model, x, y, task=self.work.task)

        acc, loss = yield Compute(run, kind="eval")
        self.last_eval_t, self.evaluated = now, self.out.version
        self.out.final_accuracy, self.out.final_loss = acc, loss
        if not self.out.history or self.out.history[-1][0] != now:
            self.out.history.append((now, acc))
        self.ctx.emit(ev.EVAL, round=self.out.version, accuracy=acc, loss=round(loss, 6))
        if not np.isfinite(loss):
            self.diverge(f"version {self.out.version}'s test loss is not finite")


def _quiet(rule, *args):
    """``rule(*args)`` without NumPy's overflow warnings: a model not finite is checked, and not taken."""
    with np.errstate(over="ignore", invalid="ignore"):
        return rule(*args)


def parameter_server(ctx, scenario, work, init: bytes | None = None):
    s = _Server(ctx, scenario, work, init)
    ps = s.ps
    peers = tuple(ps.worker_names) + ((SS,) if s.uses_ss else ())
    matched = yield WaitPeers(peers, deadline=ctx.now() + ps.barrier_timeout_s)
    ctx.emit(ev.BARRIER, matched=len(matched), missing=sorted(set(peers) - set(matched)))
    ctx.emit(ev.RUN_START, clients=ps.workers, rounds=ps.rounds, first_round=s.out.version, dim=work.dim,
             authenticated=ctx.sealed)
    if not s.resumed:
        yield from s.evaluate(force=True)
    if ps.asynchronous:  # (both loops end at once if the model diverged)
        yield from _asynchronous(s)
    else:
        yield from _synchronous(s)
    out = s.out
    if s.time_up() and out.version < ps.rounds and not s.diverged:
        out.stop_reason = "done"  # the scenario's time budget is the end it asked for
    yield s.send_model(pm.encode_ps(pm.PsStop(out.version)))
    if s.uses_ss:
        yield s.ss.stop(out.version)
    if s.evaluated != out.version:
        yield from s.evaluate(force=True)
    ctx.emit(ev.RUN_END, reason=out.stop_reason, rounds_completed=out.version, rounds_failed=out.rounds_failed,
             model_sha256=sha256_of(out.weights), counts=dict(out.counts))
    return out


def _synchronous(s: _Server):
    ctx, ps, out, strategy = s.ctx, s.ps, s.out, s.strategy
    first = out.version
    while out.version < ps.rounds and not s.time_up() and not s.diverged:
        version = out.version
        selected = strategy.configure_round(version, s.ranks) or ()   # (): every worker
        expected = set(selected) or set(s.ranks)
        start = ctx.now()
        deadline = start + ps.round_timeout_s
        ctx.emit(ev.ROUND_START, round=version, attempt=0)
        yield Point(points.ROUND, version)
        model = s.model_bytes(selected)
        if version > first or s.resumed:  # (the first model goes to each worker as it joins)
            yield s.send_model(model)
        if s.uses_ss:
            yield s.ss.begin(version)
        inbox = s.inbox
        inbox.ask_round(expected, version)
        updates: dict[int, pm.Update] = {}
        failed: set[int] = set()   # workers whose update from this version was not finite
        arrivals: dict[int, float] = {}
        quorum = strategy.quorum(len(expected))

        def act(msg, verdict):
            m = verdict.message
            if verdict.kind == JOIN:
                yield s.send_model(model, to=msg.src)
            elif verdict.kind == NOT_FINITE:
                failed.add(m.worker)
                s.not_finite(msg, m)
            elif verdict.kind == ACCEPTED:
                updates[m.worker] = m
                arrivals[m.worker] = ctx.now() - start
                out.counts["accepted"] += 1
                ctx.emit(ev.PS_UPDATE, worker=msg.src, version=m.version, iterations=m.iterations,
                         samples=m.samples, staleness=0, loss=round(m.loss, 6))
            else:   # late, future, not asked, duplicate; unsigned, forged, malformed
                s.refuse(msg, verdict.reason, verdict.error or (f"version {m.version}, now {version}" if m else ""))
            return s.diverged

        # k of the strategy's quorum, or until every worker asked has answered
        yield from collect(inbox, Quorum(quorum), deadline, act)
        if s.diverged:
            break
        short = len(updates) < quorum
        # A round short of its quorum timed out, unless every worker expected answered (some with an
        # update that was not finite).
        timed_out = short and len(updates) + len(failed) < len(expected)
        # The strategy's own quorum always aggregates (FedDrop's K - K_hat may be below min_workers);
        # min_workers is the quorum of a round its deadline closed.
        enough = not short or len(updates) >= min(ps.min_workers, len(expected))
        if enough:
            taken = weighed(list(updates.values()), s.samples)
            new = yield from s.cpu("sum", 4 * s.work.dim * len(taken),
                                   lambda: _quiet(strategy.aggregate, out.weights, taken))
            enough = s.take(new, f"round {version}'s aggregate of {len(updates)} updates")
        extra = {"not_finite": sorted(s.name_of[k] for k in failed)} if failed else {}
        ctx.emit(ev.PS_ROUND, version=version, updates=len(updates), expected=len(expected), quorum=quorum,
                 timed_out=timed_out, aggregated=enough, selected=sorted(s.name_of[k] for k in expected),
                 iterations={s.name_of[k]: u.iterations for k, u in sorted(updates.items())}, **extra)
        if s.diverged:
            break
        if not enough:
            out.rounds_failed += 1
        strategy.observe_round(version, arrivals)
        if s.uses_ss:
            for send in s.ss.missed(version, expected - set(updates)):
                yield send
        yield Point(points.AGGREGATED, version)
        out.version = version + 1
        yield from s.checkpoint()
        yield from s.evaluate()


def _asynchronous(s: _Server):
    """One update at a time: each worker is asked for an update from the model it was last sent
    (its JOIN asks for the first), which is applied as it comes."""
    ctx, ps, out, strategy, inbox = s.ctx, s.ps, s.out, s.strategy, s.inbox
    base: dict[int, np.ndarray] = {}  # the model each worker was last sent (DC-ASGD's backup)

    def act(msg, verdict):
        m = verdict.message
        if verdict.kind == NOT_FINITE:
            if s.not_finite(msg, m):
                return True
        elif verdict.kind == ACCEPTED:
            staleness = out.version - m.version
            new = yield from s.cpu("sum", m.delta.nbytes,
                                   lambda: _quiet(strategy.apply, out.weights, m.delta, staleness, base[m.worker]))
            if not s.take(new, f"{msg.src}'s update from version {m.version} (staleness {staleness})"):
                s.refuse(msg, "diverges", "applying it gives a model that is not finite")
                return True
            out.version += 1
            out.counts["accepted"] += 1
            ctx.emit(ev.PS_UPDATE, worker=msg.src, version=m.version, iterations=m.iterations,
                     samples=m.samples, staleness=staleness, loss=round(m.loss, 6))
        elif verdict.kind != JOIN:   # late, future, not asked, duplicate; unsigned, forged, malformed
            s.refuse(msg, verdict.reason, verdict.error)
            return False
        base[m.worker] = out.weights
        inbox.ask(m.worker, out.version)
        yield s.send_model(s.model_bytes(), to=msg.src)
        if verdict.kind == ACCEPTED:
            before = len(out.history)
            yield from s.evaluate()
            if len(out.history) > before:
                yield from s.checkpoint()
        return False

    going = Quorum(None, lambda: out.version < ps.rounds and not s.time_up() and not s.diverged)
    yield from collect(inbox, going, ps.max_time_s, act)
