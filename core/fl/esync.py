"""ESync's talk with its state server (Algorithm 1, core/esync/state_table.py) under
``fl.algorithm: esync``:

- ``Questions``: a client's side: REPORT when it starts a round, QUERY after each
  local iteration with c (that iteration's compute time) and m (its model's transfer time), and
  the answer, TRAIN or SYNC; a question unanswered in time counts as SYNC.
- ``Leader``: the controller's side: RESET when a round begins (the
  first one starts every record afresh), LEAVE for a client that missed its round or is not
  asked in this one (sampling: the straggler is searched among the round's clients), STOP.
- ``train_until_sync``: an FL client's round under ESync: a step, a question, until SYNC.

The state server itself is core/esync/state_server.py, the one extra role the rule brings.
"""

from __future__ import annotations

from typing import Iterable

from dtemu.core import events as ev
from dtemu.core.errors import DecodeError
from dtemu.core.ml.train import TrainResult
from dtemu.core.esync import state_messages as pm
from dtemu.core.fl.names import STATE_SERVER_NODE as SS
from dtemu.core.runtime import points
from dtemu.core.runtime.refusal import refuse
from dtemu.core.runtime.requests import Compute, Point, Recv, Send, WaitPeers
from dtemu.core.wire.topics import MODEL_BLOB, SS_REPLY, SS_STATE, TRAIN_CMD

_FROM_CONTROLLER = (TRAIN_CMD, MODEL_BLOB)   # what an FL client takes while it trains or waits


def ss_rank(fl) -> int:
    """The state server's rank in FL: after the controller (0) and the clients (1..N; core.modes.fl)."""
    return fl.clients + 1


def meet(ctx, timeout_s: float) -> WaitPeers:
    """Wait for the state server to be there, once, at the start: in real mode a message sent before
    discovery is lost (a client's REPORT, the leader's RESET)."""
    return WaitPeers((SS,), deadline=ctx.now() + timeout_s)


def _status(ctx, msg_type: int, sender: int, receiver: int, st: pm.Status) -> Send:
    data = pm.encode_state(pm.StateMsg(msg_type, sender, receiver, st))
    return Send(SS_STATE, ctx.seal(SS_STATE, st.r, data), to=SS)


class Questions:
    """A client's questions to the state server (rank ``ss_rank``), and what it measured: ``c``, the
    compute time of its last iteration; ``m``, its model's transfer time (the time one update takes
    on a symmetric link).  ``rejected`` counts the replies it refuses, by reason."""

    def __init__(self, ctx, rank: int, ss_rank: int, timeout_s: float, rejected):
        self.ctx, self.rank, self.ss_rank, self.timeout_s = ctx, rank, ss_rank, timeout_s
        self.rejected = rejected
        self.c = self.m = 0.0
        self.timeouts = 0

    def send(self, msg_type: int, i: int, r: int) -> Send:
        st = pm.Status(self.rank, i, r, self.c, self.m, self.ctx.now())
        return _status(self.ctx, msg_type, self.rank, self.ss_rank, st)

    def report(self, r: int) -> Send:
        """Round ``r`` begins here (i = 0)."""
        return self.send(pm.REPORT, 0, r)

    def ask(self, i: int, r: int, also: tuple = (), overtaken=None):
        """QUERY after iteration ``i`` of round ``r``; the action (no answer in time: SYNC).  ``also``:
        other topics to take while waiting, each message handed to ``overtaken``, which says whether
        the round went on without this client (then None: a Stop does not wait out the timeout)."""
        ctx = self.ctx
        yield self.send(pm.QUERY, i, r)
        deadline = ctx.now() + self.timeout_s
        while True:
            msg = yield Recv((SS_REPLY, *also), deadline=deadline)
            if msg is None:
                self.timeouts += 1
                return pm.SYNC
            if msg.topic != SS_REPLY:
                if overtaken(msg):
                    return None
                continue
            try:
                reply = pm.decode_state(ctx.open(msg))
                if msg.src != SS or reply.msg_type != pm.RESPONSE or reply.status.k != self.rank:
                    raise DecodeError(f"not a response to rank {self.rank} from the state server")
            except DecodeError as err:  # (an AuthError is one, with its reason)
                reason = getattr(err, "reason", "malformed")
                refuse(ctx, self.rejected, msg, reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src,
                       reason=reason, error=str(err))
                continue
            if reply.status.i == i and reply.status.r == r:
                return reply.action
            # an answer to an earlier question (it came after its deadline): wait for ours


class Leader:
    """What the controller (rank ``rank``) tells the state server (rank ``ss_rank``) of the clients'
    ranks; each method returns the Sends to yield."""

    def __init__(self, ctx, rank: int, ss_rank: int):
        self.ctx, self.rank, self.ss_rank = ctx, rank, ss_rank
        self.last_asked: frozenset = frozenset()

    def send(self, msg_type: int, k: int, r: int) -> Send:
        return _status(self.ctx, msg_type, self.rank, self.ss_rank, pm.Status(k, 0, r, 0.0, 0.0, self.ctx.now()))

    def begin(self, r: int) -> Send:
        """Round ``r`` has begun."""
        return self.send(pm.RESET, self.rank, r)

    def asked(self, r: int, asked: Iterable[int]) -> list[Send]:
        """LEAVE for those asked last round and not in ``r``: the straggler is one of this round's."""
        now = frozenset(asked)
        gone, self.last_asked = self.last_asked - now, now
        return self.missed(r, gone)

    def missed(self, r: int, ranks: Iterable[int]) -> list[Send]:
        """LEAVE for those who missed round ``r``: a crashed straggler cannot hold the others back."""
        return [self.send(pm.LEAVE, k, r) for k in sorted(ranks)]

    def stop(self, r: int) -> Send:
        return self.send(pm.STOP, self.rank, r)


def train_until_sync(ctx, fl, training, cmd, questions: Questions, overtaken):
    """An FL client's round under ESync: one step of ``training`` (core.ml.train.LocalTraining), then
    a question, until the state server says SYNC (or ``fl.esync.max_iterations``).  Returns the
    TrainResult, or None when the round went on without this client: ``overtaken(msg)`` takes a
    message of the controller's (a newer model or command, Stop) and says so; None: was it so?"""
    cap = fl.esync.max_iterations
    yield questions.report(cmd.round)
    yield Point(points.TRAIN, cmd.round)
    i = 0
    while True:
        if i > 0:
            action = pm.SYNC if cap is not None and i >= cap else \
                (yield from questions.ask(i, cmd.round, _FROM_CONTROLLER, overtaken))
            if action is None:
                break
            if action == pm.SYNC:
                result = training.result()
                # FedAvg weighs an update by the data its client holds (ESync's n_k, Eq. 13), not by how
                # many iterations the state server let it run.
                return TrainResult(result.steps, len(training.indices), result.mean_loss)
        started = ctx.now()
        yield Compute(lambda: training.run(1), samples=training.next_batch)
        questions.c = ctx.now() - started
        i += 1
        while (msg := (yield Recv(_FROM_CONTROLLER, deadline=ctx.now()))) is not None:
            overtaken(msg)   # (what came while it trained)
        if overtaken(None):
            break
    ctx.emit(ev.CMD_SKIPPED, round=cmd.round, iterations=i)
    return None
