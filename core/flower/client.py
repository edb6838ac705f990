"""A Flower client's role, written once for both runtimes: each instruction from the server is one
call of the app's ClientApp, and its reply goes back.

The call is the client's compute.  Its time on the runtime's clock: for real, what it takes (a
straggler's slowdown staged on top of a train call, as for dtemu's own training); in emu, a train
call costs the examples its reply reports (``flower.examples_key``) times the node's cost per sample,
with its slowdown and jitter; an evaluate call its examples times ``compute.eval_s_per_sample``, and
a query call ``compute.query_s``, with the node's slowdown (``emu calibrate`` times an app's train
and evaluate calls).

The app's failures are the client's to report, not to die of (Flower's simulation answers the
same way):
- the ClientApp raises, or returns something that is not a reply to its message: the client logs
  client_app_failed and answers an error reply, which the strategy counts as a failure;
- it takes longer than ``flower.call_limit_s`` of wall time (it hangs): the client logs it and answers
  nothing, as a hung node would; the call's thread is left behind (Python cannot stop a thread).
Everything the client receives is checked before the app sees it: sealed by the run's key where it
has one, a well-formed instruction, from the server, for this node; anything else is refused and
counted.  Crash points are FL's client points (faults.crashes), and faults.dropout_p makes a client
sit out a round's train instruction.
"""

from __future__ import annotations

from collections import Counter

from dtemu.core import events as ev
from dtemu.core.errors import AuthError, DecodeError
from dtemu.core.flower import wire
from dtemu.core.flower.app import FlowerApp, already_done, node_id
from dtemu.core.flower.replies import examples_of, is_train, round_of
from dtemu.core.flower.spec import SERVER
from dtemu.core.runtime import faults as faultlib
from dtemu.core.runtime import points
from dtemu.core.runtime.compute import CLIENT_EVAL, QUERY
from dtemu.core.runtime.refusal import refuse
from dtemu.core.runtime.requests import Compute, Point, Recv, Send
from dtemu.core.wire.topics import FLOWER_INS, FLOWER_RES


def client(ctx, scenario, app: FlowerApp, index: int):
    """Client ``index`` (1-based); runs until the server's Stop.  Returns the calls it answered."""
    me = node_id(index)
    app.start_client(index)
    rejected: Counter = Counter()
    answered = 0
    while True:
        msg = yield Recv((FLOWER_INS,))
        instruction = _instruction(ctx, msg, me, rejected)
        if instruction is None:
            continue
        if instruction is wire.STOP:
            break
        round_, type_ = round_of(instruction), instruction.metadata.message_type
        training = is_train(type_)
        if training and faultlib.drops_round(scenario.seed, index, round_, scenario.faults.dropout_p):
            ctx.emit(ev.DROPOUT, round=round_)
            continue
        if training:
            yield Point(points.TRAIN, round_)
            # (as an FL client's: a round's compute, for the report and emu validate's units; its
            # examples are the reply's, unknown until the app returns)
            ctx.emit(ev.TRAIN_START, round=round_, samples=0)
        outcome = yield Compute(lambda: app.call(instruction, index),
                                kind="train" if training else "eval")
        if outcome.error:
            ctx.emit(ev.CLIENT_APP_FAILED, round=round_, type=type_, error=outcome.error, hung=outcome.reply is None)
            if outcome.reply is None:
                continue
        examples = examples_of(outcome.reply, scenario.flower.examples_key)
        ctx.emit(ev.FLOWER_CALL, round=round_, type=type_, examples=examples, wall_s=round(outcome.wall_s, 6),
                 cpu_s=round(outcome.cpu_s, 6))
        kind = "train" if training else QUERY if type_.split(".")[0] == QUERY else CLIENT_EVAL
        if not outcome.error and (examples or kind == QUERY):  # its time in the compute model (emu), known now
            yield Compute(already_done, samples=examples or 0, kind=kind)
        data = ctx.seal(FLOWER_RES, round_, wire.encode(wire.REPLY, outcome.reply))
        if training:
            ctx.emit(ev.UPLOAD_START, round=round_, bytes=len(data))
            yield Point(points.UPLOAD, round_)
        yield Send(FLOWER_RES, data, to=SERVER)
        answered += 1
        if training:
            yield Point(points.UPLOADED, round_)
    ctx.emit(ev.CLIENT_STOP, round=0, reason="server", rejected=dict(rejected))
    return answered



def _instruction(ctx, msg, me: int, rejected: Counter):
    """The instruction in ``msg`` (wire.STOP for the server's Stop), or None if it was refused."""
    try:
        body = ctx.open(msg)
        kind = wire.kind_of(body)
        if msg.src != SERVER:
            raise DecodeError(f"{msg.src} is not the server")
        if kind == wire.STOP:
            return wire.STOP
        if kind != wire.INSTRUCTION:
            raise DecodeError("not an instruction")
        instruction = wire.decode(body)
        if instruction.metadata.dst_node_id != me or instruction.has_error():
            raise DecodeError(f"an instruction for node {instruction.metadata.dst_node_id}, not this one")
        return instruction
    except DecodeError as err:
        reason = err.reason if isinstance(err, AuthError) else "malformed"
        refuse(ctx, rejected, msg, reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src, reason=reason,
               error=str(err))
        return None
