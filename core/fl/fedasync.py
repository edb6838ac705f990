"""fl.algorithm fedasync, asgd, dcasgd: the controller applies each update as it comes, by the
strategy's rule (core.fl.strategy: FedAsync's mixing, ASGD's sum, DC-ASGD's compensated step),
and asks its client again, on the model it has now.

``fl.sample`` (or every client) is how many train at once.  At the start they are drawn from
the clients available; each time one answers, its update is applied (FedAsync:
x ← (1 − a)·x + a·(x_τ + Δ), a = fl.fedasync.alpha · s(t − τ), τ the version it trained from;
ASGD: x ← x + server_lr·Δ; DC-ASGD: x ← x − server_lr·η·g', g = −Δ/η compensated for x − x_τ),
the new version is checkpointed (and evaluated, every fl.eval_every), and one client is drawn from those available and not at work (the one just back among them) and sent that
model and a command.  A client silent for fl.round_timeout_s is given up and replaced.  Each
applied update is one of fl.rounds; the events say so as a round of one update
(round_start, update_accepted with its staleness, round_close, aggregated, checkpoint), so that
the audit, the report and the dashboard read a fedasync run as they read any other.

The model goes down whole (fl.downlink_codec fp32): each client trains from its own version.
"""

from __future__ import annotations

import numpy as np

from dtemu.core import events as ev
from dtemu.core.runtime.verdict import ACCEPTED
from dtemu.core.fl.steps import accepted, aggregate, blob, checkpoint, evaluate, out_of_time, refuse_update
from dtemu.core.ml.workload import round_seed
from dtemu.core.runtime import points
from dtemu.core.runtime.collect import FIRST, collect
from dtemu.core.runtime.requests import Point, Send, Sleep
from dtemu.core.wire import messages
from dtemu.core.wire.messages import TrainCmd
from dtemu.core.wire.topics import MODEL_BLOB, TRAIN_CMD

_PICK = 0xA5C  # (the stream that draws the next client, apart from the rounds' sampling)


def run(ctx, scenario, work, result, population, inbox, strategy, start: int):
    """Apply updates by ``strategy`` until fl.rounds versions are made; returns the last version."""
    fl, auth = scenario.fl, ctx.sealer
    version = start - 1
    bases: dict[int, np.ndarray] = {version: result.weights}   # the models clients are training from
    at_work: dict[str, tuple[int, float]] = {}                   # client -> (its base version, deadline)
    asks = 0

    def ask(client: str):
        nonlocal asks
        asks += 1
        cmd = TrainCmd(version + 1, fl.subset or 0, fl.epochs, fl.lr, round_seed(scenario.seed, version + 1, asks))
        inbox.ask(client, (cmd.round, cmd.seed))
        at_work[client] = (version, ctx.now() + fl.round_timeout_s)
        yield Send(MODEL_BLOB, auth.seal(MODEL_BLOB, version, blob(version, bases[version])), to=(client,))
        yield Send(TRAIN_CMD, auth.seal(TRAIN_CMD, cmd.round, messages.encode(cmd)), to=(client,))

    def refill():
        """Draw clients from those available and not at work until fl.sample of them are."""
        free = [c for c in population.online(ctx.now()) if c not in at_work]
        rng = np.random.default_rng([scenario.seed, _PICK, version, asks])
        while len(at_work) < population.asked and free:
            yield from ask(free.pop(int(rng.integers(len(free)))))

    taken = []   # the update a collection took: (message, verdict)

    def act(msg, verdict) -> bool:
        if verdict.kind == ACCEPTED:
            taken.append((msg, verdict))
        else:
            refuse_update(ctx, result.counts, msg, verdict, current=version + 1)
        return False

    yield from refill()
    while version < fl.rounds:
        if not at_work:  # no one there to ask: wait a round's time for someone to come
            yield Sleep(fl.round_timeout_s)
            yield from refill()
            continue
        taken.clear()
        if (yield from collect(inbox, FIRST, min(d for _, d in at_work.values()), act)) == "deadline":
            # the client due first is given up, and replaced
            gone = [c for c, (_, d) in at_work.items() if d <= ctx.now()]
            for c in gone:
                del at_work[c]
            inbox.close(gone)   # whatever they still send is late
            ctx.emit(ev.ROUND_FAILED, round=version + 1, ready=0, min=1, policy="replace")
            result.rounds_failed += 1
            yield from refill()
            continue
        (msg, verdict), = taken
        client = verdict.message.client
        base, _ = at_work.pop(client)
        staleness = version - base
        version += 1
        ctx.emit(ev.ROUND_START, round=version, attempt=0)
        accepted(ctx, result.counts, msg, verdict, round_=version, staleness=staleness)
        ctx.emit(ev.ROUND_CLOSE, round=version, ready=1, expected=1, min=1, clients=[client], timed_out=False,
                 note=f"{client}'s update from version {base} (staleness {staleness}{strategy.describe(staleness)})")
        result.weights = yield from aggregate(ctx, scenario, version, lambda: strategy.apply(
            result.weights, verdict.item.payload.to_dense(), staleness, bases[base]), [verdict.item])
        result.rounds_completed += 1
        bases[version] = result.weights
        for v in [v for v in bases if v != version and all(b != v for b, _ in at_work.values())]:
            del bases[v]   # no client trains from it any more
        yield Point(points.AGGREGATED, version)
        yield from checkpoint(ctx, scenario, result, version, {})
        over = out_of_time(ctx, fl)
        yield from evaluate(fl, work, result.weights, version, last=over)
        if over:
            result.stop_reason = f"fl.max_time_s ({fl.max_time_s:g} s) reached after version {version}"
            break
        if version < fl.rounds:
            yield from refill()
    return version
