"""The Flower server's role, written once for both runtimes: it runs the app's ServerApp and carries
out each of its grid calls over dtemu's network and clock.

- ``send_and_receive``: send each instruction to its node, then take replies until every one is in
  or the deadline passes: the call's timeout, at most ``fl.round_timeout_s``, counted from before the
  first instruction leaves.  The replies go back to the app in the order their instructions were
  sent (not as they arrived, which is timing): the same replies give the same aggregate in emu and
  for real.
- ``push_messages`` / ``pull_messages``: the same halves apart; a pull with nothing in waits for a
  reply at most ``POLL_S`` of the runtime's clock (Flower's own grid sleeps between pulls).

Everything a client sends goes through the inbox (core.runtime.inbox, every server's, with this
role's ``ReplyReader``); what it refuses is counted and logged through the one refusal path and never
reaches the app.  A reply that carries the ClientApp's
error is the app's to judge (Flower's strategies count it as a failure).  A client offline under
``fl.availability`` is not sent to: as a node that is not connected, it does not answer.

The app's own work between two grid calls is charged to the server node before the call is carried
out: the MB of arrays it handled (the replies it was last given, what it sends now) times
``compute.app_s_per_mb`` (emu; real spends what it spends), and logged with what it measured
(``server_app``: what ``emu calibrate`` fits the cost to).

The Grid the ServerApp is handed (``make_grid``) is Flower's Grid interface, each call handed to this
role through the app's thread (host.flower_app).  ``get_node_ids`` lists every client, as Flower's
simulation registers every node: the scenario's faults and availability decide who answers, not who
is listed (a SuperLink's list would change with them, but a strategy that waits for a node to connect
polls with a wall-clock sleep, which the emulator's clock cannot serve).

For the dashboard, the report and the audit, a train call is logged as an FL round is: round_start,
update_accepted per reply, round_close; an evaluate call's replies give the round's accuracy (their
mean of ``flower.accuracy_key`` weighted by their examples), logged as ``eval``.

What the inbox needs of Flower (``ReplyReader``): a reply answers the instruction whose id it names,
and only the node it went to may answer it.

An instruction the server sent is *open* until the grid call that sent it closes (its replies are all
in, or its deadline passed).  A reply is then one of:

- accepted: an authentic, well-formed reply from the node asked, to an open instruction.  Its arrays
  are the app's to judge, as in Flower: NaN, another dtype (FedAdam's float64 under NumPy 2 answered
  in float32), other shapes, other keys or part of the model reach the strategy.  With
  ``flower.check_arrays`` they must load, be finite and match what the instruction carried
  (core.flower.wire.check_reply), else the reply is refused as invalid and counted;
- late: to an instruction whose call has closed (the app has moved on);
- duplicate: a second reply to the same instruction;
- refused, with a reason: unsigned or forged (sealed runs), malformed, not a reply, a reply to
  nothing the server sent, from a node that was not asked, or invalid arrays (``check_arrays``).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from dtemu.core import events as ev
from dtemu.core.errors import AppError, DecodeError
from dtemu.core.fl.steps import barrier
from dtemu.core.flower import wire
from dtemu.core.flower.app import RUN_ID, Call, FlowerApp, Finished, already_done, node_id
from dtemu.core.flower.replies import accuracy_of, array_bytes, examples_of, is_train, round_of
from dtemu.core.modes.base import DONE
from dtemu.core.runtime.refusal import refuse
from dtemu.core.runtime.compute import SERVER_APP
from dtemu.core.runtime.inbox import Answer, Inbox
from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, LATE, REFUSED, Verdict
from dtemu.core.runtime.collect import Quorum, collect
from dtemu.core.runtime.requests import Compute, Send
from dtemu.core.wire.topics import FLOWER_INS, FLOWER_RES

POLL_S = 0.1


@dataclass
class ServerResult:
    rounds_completed: int = 0  # train calls that got at least one usable reply
    rounds_failed: int = 0  # train calls that got none
    final_accuracy: float | None = None
    stop_reason: str = DONE
    counts: Counter = field(default_factory=Counter)
    history: list = field(default_factory=list)  # (time, accuracy) of every evaluate call
    model_sha256: str | None = None  # of the arrays the server last sent


# --- the inbox's reader of replies ----------------------------------------------------------
@dataclass(frozen=True)
class Asked:
    """One instruction sent: to whom, of which round and type, and the arrays it carried."""

    node: str
    round: int
    type: str
    arrays: dict


class ReplyReader:
    def __init__(self, check_arrays: bool):
        self.check_arrays = check_arrays

    def read(self, src: str, sealed) -> Answer:
        """A reply answers the instruction it names (its tag: none, an instruction is asked once)."""
        if wire.kind_of(sealed.data) != wire.REPLY:
            raise _NotAReply("a Flower frame, but not a reply")
        reply = wire.decode(sealed.data)
        return Answer(reply.metadata.reply_to_message_id, None, reply)

    def check(self, answer: Answer, question) -> Verdict:
        reply = answer.body
        if self.check_arrays and not reply.has_error():
            try:
                wire.check_reply(reply, question.about.arrays)
            except DecodeError as err:
                return Verdict(REFUSED, "invalid", str(err))
        return Verdict(ACCEPTED, "accepted")


def reply_inbox(sealer, check_arrays: bool = False) -> Inbox:
    """The server's inbox: each instruction sent is asked with ``ask(its id, None, about=Asked,
    sender=its node)`` and closed with ``close`` when its grid call is over."""
    return Inbox(sealer, FLOWER_RES, ReplyReader(check_arrays))


class _NotAReply(DecodeError):
    reason = "not_a_reply"


def make_grid(thread, node_ids: list[int]):
    """The ServerApp's Grid; ``thread``: the app's handle (FlowerApp.server_thread), whose ``ask``
    hands a call to this role."""
    from flwr.app import Message
    from flwr.serverapp import Grid
    from flwr.supercore.run import Run

    class DtemuGrid(Grid):
        def __init__(self):
            self._run = Run.create_empty(RUN_ID)

        def set_run(self, run) -> None:
            self._run = run

        @property
        def run(self):
            return self._run

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
            return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

        def get_node_ids(self):
            return list(node_ids)

        def push_messages(self, messages):
            return thread.ask(Call("push_messages", (list(messages),)))

        def pull_messages(self, message_ids):
            return thread.ask(Call("pull_messages", (list(message_ids),)))

        def send_and_receive(self, messages, *, timeout=None):
            return thread.ask(Call("send_and_receive", (list(messages),), timeout))

    return DtemuGrid()


def server(ctx, scenario, app: FlowerApp, population=None):
    fl = scenario.fl
    clients = scenario.client_names
    ids = [node_id(i) for i in range(1, len(clients) + 1)]
    rounds = app.run_config.get("num-server-rounds")
    ctx.emit(ev.RUN_START, clients=list(clients), rounds=rounds if isinstance(rounds, int) else 0, first_round=1,
             dim=0, authenticated=ctx.sealed)
    yield from barrier(ctx, fl, clients)
    _identify()
    random.seed(scenario.seed)  # Flower's strategies draw their clients with the random module
    thread = app.server_thread(lambda t: app.server_app(make_grid(t, ids), app.server_context()))
    grid = _Carrier(ctx, scenario, app, dict(zip(ids, clients)), population)
    failure, given = None, 0   # given: the bytes of the arrays in the replies the app was last given
    try:
        while True:
            call = thread.next()
            if isinstance(call, Finished):
                failure = call
                break
            handled = given + (array_bytes(call.args[0]) if call.name != "pull_messages" else 0)
            ctx.emit(ev.SERVER_APP, call=call.name, nbytes=handled, wall_s=round(thread.gap, 6),
                     cpu_s=round(thread.cpu_gap, 6))
            yield Compute(already_done, kind=SERVER_APP, nbytes=handled)
            answer = yield from grid.carry_out(call)
            given = array_bytes(answer) if call.name != "push_messages" else 0
            thread.answer(answer)
    finally:  # the role's node crashed, or the run ended: the app's thread ends with it
        thread.cancel()
    yield Send(FLOWER_INS, ctx.seal(FLOWER_INS, 0, wire.encode(wire.STOP)))
    result = grid.result
    if failure.error is not None:
        error = f"{type(failure.error).__name__}: {failure.error}"
        ctx.emit(ev.SERVER_APP_FAILED, error=error, traceback=failure.trace)
        raise AppError(f"the ServerApp raised {error} (its traceback is in events.jsonl, server_app_failed)",
                       failure.trace)
    ctx.emit(ev.RUN_END, reason=result.stop_reason, rounds_completed=result.rounds_completed,
             rounds_failed=result.rounds_failed, model_sha256=result.model_sha256,
             counts=dict(sorted(result.counts.items())))
    result.final_accuracy = result.history[-1][1] if result.history else None
    return result


def _identify() -> None:
    """The identity Flower stamps on the Messages a ServerApp makes (a SuperLink sets it per process)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from dtemu.core.flower.app import RUN_ID

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, SUPERLINK_NODE_ID, 0


class _Carrier:
    """Carries out the app's grid calls with the role's requests; keeps what arrived until pulled."""

    def __init__(self, ctx, scenario, app, name_of: dict[int, str], population):
        self.ctx, self.fl, self.fs, self.app = ctx, scenario.fl, scenario.flower, app
        self.index_of = {name: i for i, name in enumerate(scenario.client_names, 1)}
        self.name_of = name_of
        self.population = population if scenario.fl.availability.kind != "always" else None
        self.inbox = reply_inbox(ctx.sealer, check_arrays=scenario.flower.check_arrays)
        self.arrived: dict[str, object] = {}  # message id -> accepted reply, in arrival order
        self.result = ServerResult()
        self.seq = 0
        self.train_round = None  # the round of the last train instructions (round_start once per round)

    def carry_out(self, call):
        if call.name == "send_and_receive":
            return (yield from self._send_and_receive(call.args[0], call.timeout))
        if call.name == "push_messages":
            return (yield from self._push(call.args[0]))
        return (yield from self._pull(call.args[0]))

    def _send_and_receive(self, messages, timeout):
        timeout = self.fl.round_timeout_s if timeout is None else min(timeout, self.fl.round_timeout_s)
        deadline = self.ctx.now() + timeout
        sent = yield from self._push(messages)
        yield from self._collect(sent, deadline, until_all=True)
        self.inbox.close(sent)
        # In the order the instructions went out, not the order of arrival: the app sums what it gets in
        # this order, and arrival order is timing (real mode's differs from emu's, run to run)
        replies = [self.arrived.pop(mid) for mid in sent if mid in self.arrived]
        # How it ended, truthfully: a call whose every instruction was answered did not time out, even
        # where some answers were refused.
        ended = "timed_out" if self.inbox.unanswered(sent) else "all_in" if len(replies) == len(sent) else "refused"
        self._closed(messages, replies, ended)
        return replies

    def _pull(self, message_ids):
        wanted = set(message_ids)
        if not any(mid in wanted for mid in self.arrived):
            yield from self._collect(list(wanted), self.ctx.now() + POLL_S, until_all=False)
        return [self.arrived.pop(mid) for mid in message_ids if mid in self.arrived]

    # --- sending ---------------------------------------------------------
    def _push(self, messages):
        ctx, counts = self.ctx, self.result.counts
        online = set(self.population.online(ctx.now())) if self.population is not None else None
        # id of a content -> (its proto, its arrays, their sha256): one encoding for every node it goes to
        content = {}
        sent, groups = [], {}
        for message in messages:
            self.seq += 1
            mid = f"dtemu-{self.seq}"
            message.metadata.__dict__["_message_id"] = mid  # (as Flower's own grids set it)
            node = self.name_of.get(message.metadata.dst_node_id)
            if node is None:
                counts["unknown_node"] += 1
                continue
            round_, type_ = round_of(message), message.metadata.message_type
            key = id(message.content) if message.has_content() else None
            if key not in content:
                proto, arrays = wire.content_of(message)
                content[key] = proto, arrays, wire.model_sha256(next(iter(arrays.values()))) if arrays else None
            proto, arrays, sha = content[key]
            self.inbox.ask(mid, None, about=Asked(node, round_, type_, arrays), sender=node)
            sent.append(mid)
            group = groups.setdefault((round_, type_), {"asked": 0, "bytes": 0, "unavailable": 0})
            if is_train(type_) and round_ != self.train_round:
                self.train_round = round_
                ctx.emit(ev.ROUND_START, round=round_, attempt=0)
            if arrays:
                self.result.model_sha256 = sha
            if online is not None and node not in online:
                group["unavailable"] += 1
                counts["unavailable"] += 1
                continue
            frame = wire.encode(wire.INSTRUCTION, message, content=proto)
            self.app.prefetch(self.index_of[node], frame, mid)
            data = ctx.seal(FLOWER_INS, round_, frame)
            group["asked"] += 1
            group["bytes"] += len(data)
            yield Send(FLOWER_INS, data, to=node)
        for (round_, type_), group in groups.items():
            ctx.emit(ev.FLOWER_SENT, round=round_, type=type_, **group)
        return sent

    # --- receiving -------------------------------------------------------
    def _collect(self, message_ids, deadline, until_all: bool):
        """Replies until every one of ``message_ids`` is in (or, ``until_all`` False, one of them),
        or ``deadline``."""
        ctx, counts = self.ctx, self.result.counts
        wanted = set(message_ids)

        def act(msg, verdict) -> bool:
            asked = verdict.asked
            if verdict.kind == ACCEPTED:
                mid = verdict.message.metadata.reply_to_message_id
                self.arrived[mid] = verdict.message
                if verdict.message.has_error():  # the app's to judge; logged for the audit, not refused
                    counts["client_error"] += 1
                    ctx.emit(ev.UPDATE_REJECTED, client=msg.src, round=asked.round, reason="client_error",
                             error=verdict.message.error.reason[:200])
                elif is_train(asked.type):
                    counts["accepted"] += 1
                    ctx.emit(ev.UPDATE_ACCEPTED, client=msg.src, round=asked.round, bytes=len(msg.data),
                             num_samples=examples_of(verdict.message, self.fs.examples_key), sent_at=msg.sent_at,
                             comm_s=msg.received_at - msg.sent_at)
                else:
                    counts["evaluated"] += 1
                return not until_all and mid in wanted
            if verdict.kind == LATE:
                refuse(ctx, counts, msg, "late", ev.UPDATE_LATE, client=msg.src, round=asked.round,
                       current=self.train_round or 0)
            elif verdict.kind == DUPLICATE:
                refuse(ctx, counts, msg, "duplicate", ev.UPDATE_REJECTED, client=msg.src, round=asked.round,
                       reason="duplicate")
            elif asked is not None and asked.node == msg.src:  # its own answer, unusable (its arrays)
                refuse(ctx, counts, msg, verdict.reason, ev.UPDATE_REJECTED, client=msg.src, round=asked.round,
                       reason=verdict.reason, error=verdict.error)
            else:
                refuse(ctx, counts, msg, verdict.reason, ev.UPDATE_REJECTED, src=msg.src, reason=verdict.reason,
                       error=verdict.error)
            return False

        yield from collect(self.inbox, Quorum(None, lambda: bool(self.inbox.unanswered(wanted))), deadline, act)

    def _closed(self, messages, replies, ended: str) -> None:
        """Log a closed send_and_receive: as an FL round (train) or the round's accuracy (evaluate)."""
        ctx, result = self.ctx, self.result
        if not messages:
            return
        round_, type_ = round_of(messages[0]), messages[0].metadata.message_type
        good = [r for r in replies if not r.has_error()]
        ctx.emit(ev.FLOWER_REPLIES, round=round_, type=type_, asked=len(messages), replies=len(replies),
                 errors=len(replies) - len(good), timed_out=ended == "timed_out", ended=ended)
        if is_train(type_):
            names = sorted(self.inbox.question(r.metadata.reply_to_message_id).about.node for r in good)
            ctx.emit(ev.ROUND_CLOSE, round=round_, ready=len(good), expected=len(messages), min=1, clients=names,
                     timed_out=ended == "timed_out", ended=ended,
                     note=f"final-ready={len(good)}/{len(messages)} (errors={len(replies) - len(good)})")
            if good:
                result.rounds_completed += 1
            else:
                result.rounds_failed += 1
        elif type_.split(".")[0] == "evaluate":
            accuracy = accuracy_of(good, self.fs.accuracy_key, self.fs.examples_key)
            if accuracy is not None:
                ctx.emit(ev.EVAL, round=round_, accuracy=accuracy)
                result.history.append((ctx.now(), accuracy))
