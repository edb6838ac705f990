"""The federated-learning controller, written once for both runtimes.

Per round: publish a TrainCmd to the clients the strategy (core.fl.rules) and the population
choose, collect ClientUpdates until the strategy's quorum of them has answered or the round's
timeout passes, aggregate if at least ``min_clients`` arrived, checkpoint, publish the new
ModelBlob, evaluate.
Nothing a client sends can stop it: malformed, late, duplicate, unknown or
non-finite updates are counted, logged and left out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dtemu.core.wire import messages
from dtemu.core.fl.aggregate import Update
from dtemu.core.fl.inbox import update_inbox
from dtemu.core.runtime.collect import Quorum, always, collect
from dtemu.core.runtime.inbox import Inbox
from dtemu.core.runtime.verdict import ACCEPTED
from dtemu.core.fl.esync import Leader, meet, ss_rank
from dtemu.core.fl.rules import STATE_SERVER, fl_strategy
from dtemu.core.wire.checkpoint import decode_checkpoint
from dtemu.core.errors import CheckpointError
from dtemu.core.wire.messages import Stop, TrainCmd
from dtemu.core.ml.params import sha256_of
from dtemu.core.runtime import points
from dtemu.core.runtime.requests import Evaluations, Point, Send, Sleep
from dtemu.core.wire.topics import MODEL_BLOB, TRAIN_CMD
from dtemu.core.ml.workload import Workload, round_seed
from dtemu.core.fl.population import Population
from dtemu.core.fl.downlink import Downlink
from dtemu.core.fl import fedasync
from dtemu.core.fl.steps import accepted, aggregate, barrier, blob, checkpoint, evaluate, out_of_time, refuse_update
from dtemu.core import events as ev

if TYPE_CHECKING:  # (an annotation only: the scenario imports the modes, which import the roles)
    from dtemu.core.scenario import Scenario

@dataclass
class ControllerResult:
    weights: np.ndarray
    rounds_completed: int = 0
    rounds_failed: int = 0
    final_accuracy: float | None = None
    stop_reason: str = "done"
    counts: Counter = field(default_factory=Counter)
    history: list = field(default_factory=list)  # (time, accuracy) of every evaluation


def controller(ctx, scenario: Scenario, work: Workload, init: bytes | None = None,
               population: Population | None = None):
    """Every message goes through the context's sealing layer (core.wire.auth; the identity without a key).
    ``population``: who is available and asked each round (built from the scenario if None;
    a trace's windows come from the host)."""
    fl = scenario.fl
    clients = tuple(scenario.client_names)
    population = population or Population(scenario)
    auth = ctx.sealer
    inbox = update_inbox(frozenset(clients), work.dim, fl.max_update_norm, auth)
    # fl.init: the model's seeded weights, or Xavier's (ESync's w^0)
    result = ControllerResult(weights=work.initial_weights if fl.init == "seeded" else work.xavier_weights)
    strategy = fl_strategy(scenario)  # fl.algorithm (core.fl.rules)
    start = 1
    if init is not None:
        ckpt = decode_checkpoint(init, expected_dim=work.dim)
        if ckpt.scenario_digest != scenario.digest():
            raise CheckpointError(
                "checkpoint was written by a different scenario (its model, data or training "
                "settings differ); resume with the scenario that wrote it"
            )
        result.weights, start = ckpt.weights, ckpt.round + 1
        strategy.restore(ckpt.state)  # a server optimizer's moments, TiFL's tiers, go on where they were
        result.rounds_completed = ckpt.extra.get("rounds_completed", ckpt.round)
        result.rounds_failed = ckpt.extra.get("rounds_failed", 0)
        counts = ckpt.extra.get("counts", {})  # the tallies survive a restart too
        if isinstance(counts, dict):
            result.counts.update({k: v for k, v in counts.items() if isinstance(v, int)})
        ctx.emit(ev.RESUME, round=ckpt.round, model_sha256=sha256_of(result.weights))
    ctx.emit(ev.RUN_START, clients=list(clients), rounds=fl.rounds, first_round=start, dim=work.dim,
             authenticated=auth.enabled)

    yield from barrier(ctx, fl, clients)
    # fl.algorithm esync: what the rounds tell its state server (core.fl.esync)
    ss = Leader(ctx, 0, ss_rank(fl)) if fl.algorithm in STATE_SERVER else None
    if ss is not None:
        yield meet(ctx, fl.barrier_timeout_s)
    # fl.downlink_codec: the model goes down as a compressed delta on the clients' reference
    downlink = Downlink(fl, clients) if fl.downlink_codec != "fp32" else None
    if strategy.asynchronous:  # each update applied as it comes, then its client asked again
        # (no broadcast first: each command goes with the model it is on, the first ones too; a
        # broadcast before them sent every client the model twice, 0.8 s of a FedAsync row's link)
        round_ = yield from fedasync.run(ctx, scenario, work, result, population, inbox, strategy, start)
    else:
        first = downlink.full(start - 1, result.weights) if downlink else blob(start - 1, result.weights)
        yield Send(MODEL_BLOB, auth.seal(MODEL_BLOB, start - 1, first))
        round_ = yield from _rounds(ctx, scenario, work, result, population, inbox, strategy, downlink, start, ss)

    last = min(round_, fl.rounds)
    yield Send(TRAIN_CMD, auth.seal(TRAIN_CMD, last, messages.encode(Stop(last, result.stop_reason))))
    if ss is not None:
        yield ss.stop(last)
    ctx.emit(ev.RUN_END, reason=result.stop_reason, rounds_completed=result.rounds_completed,
             rounds_failed=result.rounds_failed, model_sha256=sha256_of(result.weights),
             counts=dict(sorted(result.counts.items())))
    evaluations = yield Evaluations()  # the driver logged each as it came (``eval``)
    result.history = [(t, acc) for t, _, acc in evaluations if acc is not None]
    result.final_accuracy = result.history[-1][1] if result.history else None
    return result


def _client_rank(name: str) -> int:
    return int(name[len("client"):])   # client<rank> (core.scenario.client_names)


def _rounds(ctx, scenario, work, result, population, inbox, strategy, downlink, start, ss=None):
    """Synchronous rounds: a command to the clients asked, their updates until all are in or the
    deadline, the rule over them, the checkpoint, the new model down, an evaluation.  ``ss``: the
    state server's ``Leader`` (esync), told when a round begins and who is in it."""
    fl, auth = scenario.fl, ctx.sealer
    round_, attempt = start, 0
    while round_ <= fl.rounds:
        cmd = TrainCmd(round_, fl.subset or 0, fl.epochs, fl.lr, round_seed(scenario.seed, round_, attempt))
        ctx.emit(ev.ROUND_START, round=round_, attempt=attempt)
        yield Point(points.ROUND, round_)
        started = ctx.now()
        deadline = started + fl.round_timeout_s  # the round's clock starts before the command leaves
        if ss is not None:
            yield ss.begin(round_)
        asked = yield from _ask(ctx, scenario, population, strategy, cmd, attempt)
        for send in ss.asked(round_, map(_client_rank, asked)) if ss is not None else ():
            yield send
        quorum = strategy.quorum(len(asked))   # (FedDrop's closes a round before everyone answered)
        if asked:
            updates, arrivals = yield from _collect(ctx, inbox, cmd, asked, quorum, started, deadline,
                                                    result.counts)
            strategy.observe_round(cmd.seed, arrivals)
        else:  # no one there to ask: the round waits out its time (someone may come)
            updates = {}
            yield Sleep(max(0.0, deadline - ctx.now()))
        ready = len(updates)
        missed = [c for c in asked if c not in updates]
        for send in ss.missed(round_, map(_client_rank, missed)) if ss is not None else ():
            yield send
        if downlink is not None:
            downlink.missed(missed)
        ctx.emit(
            ev.ROUND_CLOSE,
            round=round_,
            ready=ready,
            expected=len(asked),
            min=fl.min_clients,
            clients=sorted(updates),
            timed_out=ready < quorum,
            note=f"final-ready={ready}/{len(asked)} (min={fl.min_clients})",
        )
        if ready >= fl.min_clients:
            taken = list(updates.values())
            result.weights = yield from aggregate(ctx, scenario, round_,
                                                  lambda: strategy.aggregate(result.weights, taken), taken)
            result.rounds_completed += 1
            yield Point(points.AGGREGATED, round_)
        else:
            result.rounds_failed += 1
            ctx.emit(ev.ROUND_FAILED, round=round_, ready=ready, min=fl.min_clients, policy=fl.on_failed_round)
            if fl.on_failed_round == "stop":
                result.stop_reason = f"round {round_} got {ready} of the {fl.min_clients} updates it needs"
                break
            if fl.on_failed_round == "retry" and attempt < fl.max_retries:
                attempt += 1
                continue
        yield from checkpoint(ctx, scenario, result, round_, strategy.state())
        if downlink is not None:
            yield from downlink.publish(ctx, round_, result.weights, auth.seal)
        else:
            yield Send(MODEL_BLOB, auth.seal(MODEL_BLOB, round_, blob(round_, result.weights)))
        over = out_of_time(ctx, fl)
        yield from evaluate(fl, work, result.weights, round_, last=over)
        if over:
            result.stop_reason = f"fl.max_time_s ({fl.max_time_s:g} s) reached after round {round_}"
            break
        round_, attempt = round_ + 1, 0

    return round_


def _ask(ctx, scenario, population, strategy, cmd, attempt):
    """Send ``cmd`` to the round's clients and return them: the strategy's choice among those
    available (TiFL's tier), or else the population's draw (fl.sample, availability), or else
    every client (the command then goes to everyone listening)."""
    round_, auth = cmd.round, ctx.sealer
    asked = available = None
    if strategy.selects:   # (asks who is available only where the strategy chooses: O(clients) a round)
        online = population.online(ctx.now())
        chosen = strategy.configure_round(cmd.seed, online)
        if chosen is not None:
            asked, available = tuple(chosen), len(online)
    if asked is None and population.sampled:  # the clients drawn from those available, no one else
        drawn, available = population.choose(ctx.now(), cmd.seed)
        asked = tuple(drawn)
    if asked is not None:
        ctx.emit(ev.SAMPLED, round=round_, attempt=attempt, available=available, asked=len(asked),
                 clients=list(asked))
    yield Send(TRAIN_CMD, auth.seal(TRAIN_CMD, round_, messages.encode(cmd)), to=asked)
    return tuple(scenario.client_names) if asked is None else asked


def _collect(ctx, inbox: Inbox, cmd, clients, quorum: int, start: float, deadline: float, counts):
    """Updates for ``cmd`` until ``quorum`` of them are in or ``deadline``, and each one's time
    from the round's ``start``; everything else is counted."""
    inbox.ask_round(clients, (cmd.round, cmd.seed))
    got: dict[str, Update] = {}
    arrivals: dict[str, float] = {}

    def act(msg, verdict) -> bool:
        if verdict.kind != ACCEPTED:
            refuse_update(ctx, counts, msg, verdict, current=cmd.round)
            return False
        got[verdict.message.client] = verdict.item
        arrivals[verdict.message.client] = ctx.now() - start
        accepted(ctx, counts, msg, verdict)
        return False

    # k of: the quorum, waiting out the deadline for it even when every client asked has answered
    yield from collect(inbox, Quorum(quorum, always), deadline, act)
    return got, arrivals
