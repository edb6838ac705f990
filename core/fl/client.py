"""The federated-learning client, written once for both runtimes.

It keeps the newest model it has heard of and acts on the newest command:
commands that were overtaken while it was busy (a straggler) are skipped, and a
command whose base model has not arrived yet waits for it.  Training runs
whole epochs over the round's subset; the update (new weights minus the base)
goes back encoded with the scenario's codec.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from dtemu.core.compression import codecs
from dtemu.core.wire import messages
from dtemu.core.wire.auth import Sealer  # (the type of ctx.sealer)
from dtemu.core.errors import AuthError, DecodeError
from dtemu.core.wire.messages import ClientUpdate, ModelBlob, ModelDelta, Stop, TrainCmd
from dtemu.core.fl.downlink import HeldModel
from dtemu.core.fl.esync import Questions, meet, ss_rank, train_until_sync
from dtemu.core.fl.rules import STATE_SERVER
from dtemu.core.fl.residuals import Residuals
from dtemu.core.runtime import points
from dtemu.core.runtime.requests import Compute, Point, Recv, Send
from dtemu.core.wire.topics import CLIENT_UPDATE, MODEL_BLOB, TRAIN_CMD
from dtemu.core.fl.names import CONTROLLER
from dtemu.core.ml.task import training_error
from dtemu.core.ml.workload import Workload
from dtemu.core import events as ev

if TYPE_CHECKING:  # (an annotation only: the scenario imports the modes, which import the roles)
    from dtemu.core.scenario import Scenario


class _State:
    def __init__(self):
        self.model_round = -1
        # The newest model as it arrived (a ModelBlob's bytes and any ModelDeltas on top),
        # decoded only when training: an idle client holds no weights of its own, and in emu
        # every client holds the same bytes objects, so a thousand idle clients cost one copy
        # of the model, not a thousand.
        self.held = HeldModel()
        self.cmd: TrainCmd | None = None
        self.stop: Stop | None = None
        self.done: set[tuple[int, int]] = set()  # (round, seed) already answered
        # The last update sent, by its command: a controller restarted from its
        # checkpoint repeats that command, and the answer it missed goes again.
        self.last_sent: tuple[tuple[int, int], bytes] | None = None
        self.resend = False
        self.rejected: Counter = Counter()  # messages refused, by reason
        self.model_transfer_s = 0.0  # how long the newest model took to come (ESync's m)


def client(ctx, scenario: Scenario, work: Workload, index: int, residuals: Residuals | None = None):
    """Client ``index`` (1-based); runs until the controller says Stop.

    Every message goes through the context's sealing layer (core.wire.auth; the identity without a key).
    ``residuals``: where the error-feedback residuals of this process's clients live, a
    bounded number in memory (core.fl.residuals); None: this client keeps its own."""
    fl = scenario.fl
    auth = ctx.sealer
    params = codecs.CodecParams(fl.codec, chunk=fl.chunk, density=fl.density)
    feedback = codecs.ErrorFeedback(params) if fl.error_feedback and fl.codec != "fp32" else None
    if feedback is not None and residuals is not None:
        feedback.store = residuals
        residuals.forget(ctx.node)  # a new life: what an earlier one kept died with it
    state = _State()
    # fl.algorithm esync: the client asks the state server after each local iteration (core.fl.esync)
    questions = Questions(ctx, index, ss_rank(fl), fl.esync.query_timeout_s, state.rejected) \
        if fl.algorithm in STATE_SERVER else None
    if questions is not None:
        yield meet(ctx, fl.barrier_timeout_s)
    priced_encode = scenario.compute_for(ctx.node).cpu.encode_s_per_mb > 0
    while state.stop is None:
        if state.resend:
            state.resend = False
            (round_, _), data = state.last_sent
            ctx.emit(ev.UPDATE_RESENT, round=round_, bytes=len(data))
            yield Send(CLIENT_UPDATE, auth.seal(CLIENT_UPDATE, round_, data), to=CONTROLLER)
            continue
        cmd = state.cmd
        if cmd is not None and state.model_round == cmd.round - 1:
            state.cmd = None
            state.done.add((cmd.round, cmd.seed))   # (a repeat of it while ESync trains is not a new command)
            base = state.held.weights(work.dim)
            trained = yield from _train(ctx, fl, work, index, cmd, base, state, questions)
            if trained is not None:
                data = yield from _upload(ctx, cmd, base, *trained, params, feedback, auth, priced_encode)
                if data is not None:
                    state.last_sent = ((cmd.round, cmd.seed), data)
            continue
        # Block for the next message, then take whatever else is queued, so
        # that we act on the newest command and the newest model.
        msg = yield Recv((TRAIN_CMD, MODEL_BLOB))
        while msg is not None:
            _handle(ctx, state, msg, work.dim, auth)
            msg = yield Recv((TRAIN_CMD, MODEL_BLOB), deadline=ctx.now())
    ctx.emit(ev.CLIENT_STOP, round=state.stop.round, reason=state.stop.reason, rejected=dict(state.rejected))
    return state.model_round


class _Seen:
    """The last few messages decoded (and model packets checked), by the identity of their bytes.

    A message to many clients is one bytes object in emu, handed to every one of them
    (a thousand clients of one process): each would hash and decode the same model.  Decoding
    is a pure function of the bytes, so the work is done once per object; what fails to
    decode is not remembered and fails for every client, as before.  Real mode: one client
    per process, every message a new object, so this changes nothing there."""

    def __init__(self, size: int = 4):
        self.entries: list[tuple[bytes, object, set]] = []  # (data, message, dims its packet passed)

    def _find(self, data):
        for entry in self.entries:
            if entry[0] is data:
                return entry
        return None

    def decode(self, data):
        entry = self._find(data)
        if entry is not None:
            return entry[1]
        message = messages.decode(data)
        if isinstance(data, bytes):
            self.entries = [(data, message, set())] + self.entries[:3]
        return message

    def check_packet(self, data, message, dim: int) -> None:
        entry = self._find(data)
        if entry is not None and dim in entry[2]:
            return
        codecs.decode(message.packet, expected_dim=dim)
        if entry is not None:
            entry[2].add(dim)


_SEEN = _Seen()


def _handle(ctx, state: _State, msg, dim: int, auth: Sealer) -> None:
    try:
        opened = auth.open(msg.topic, msg.src, msg.data).data
        m = _SEEN.decode(opened)
        if auth.enabled and msg.src != CONTROLLER:
            raise AuthError("forged", f"{msg.src!r} is not the controller")
        if isinstance(m, ModelBlob):
            # A full model is the controller's reference as it is now: it also replaces the same
            # round's model built from deltas (a restarted controller starts a new reference).
            if m.round > state.model_round or (m.round == state.model_round and state.held.deltas):
                _SEEN.check_packet(opened, m, dim)  # a bad packet is refused now, not when used
                state.held.take_full(m.round, opened)
                state.model_round = m.round
                state.model_transfer_s = max(0.0, msg.received_at - msg.sent_at)
        elif isinstance(m, ModelDelta):
            if m.round > state.model_round:
                _SEEN.check_packet(opened, m, dim)
                if state.held.take_delta(m, opened):
                    state.model_round = m.round
                    state.model_transfer_s = max(0.0, msg.received_at - msg.sent_at)
                else:  # not on the model we hold: wait for the full model the controller will send
                    state.rejected["no_base"] += 1
        elif isinstance(m, TrainCmd):
            if state.last_sent is not None and state.last_sent[0] == (m.round, m.seed):
                state.resend = True  # the same command again: our answer was lost
            elif (m.round, m.seed) in state.done or m.round <= state.model_round or m == state.cmd:
                pass  # answered already, overtaken by a newer model, or a duplicate
            elif state.cmd is None or m.round >= state.cmd.round:
                if state.cmd is not None:
                    ctx.emit(ev.CMD_SKIPPED, round=state.cmd.round, newer=m.round)
                state.cmd = m
        elif isinstance(m, Stop):
            state.stop = m
        else:
            raise DecodeError(f"unexpected {type(m).__name__} on {msg.topic}")
    except DecodeError as err:
        reason = err.reason if isinstance(err, AuthError) else "malformed"
        state.rejected[reason] += 1
        ctx.refused(msg)
        ctx.emit(ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src, reason=reason, error=str(err))
    # A command the model we hold has overtaken can never run: drop it.
    if state.cmd is not None and state.cmd.round <= state.model_round:
        ctx.emit(ev.CMD_SKIPPED, round=state.cmd.round, model_round=state.model_round)
        state.cmd = None


def _train(ctx, fl, work: Workload, index: int, cmd: TrainCmd, base, state: _State, questions):
    """(new weights, TrainResult) of ``cmd``'s training from ``base``, or None: the training raised
    (the task's or the model's own code: this round goes on without us) or, under ESync, a newer
    round overtook it."""
    ctx.emit(ev.TRAIN_START, round=cmd.round, samples=cmd.epochs * work.subset_size(index, cmd.subset))
    try:
        if questions is not None:   # ESync: a step at a time, the state server asked between two
            questions.m = state.model_transfer_s
            training = work.local_training(base, cmd, index)
            result = yield from train_until_sync(ctx, fl, training, cmd, questions,
                                                 lambda msg: _overtaken(ctx, state, cmd, work.dim, msg))
            return None if result is None else (training.weights(), result)
        samples = cmd.epochs * work.subset_size(index, cmd.subset)
        yield Point(points.TRAIN, cmd.round)
        if hasattr(work, "train_job"):  # the work as data too, for a runtime with worker processes
            job = work.train_job(base, cmd, index)
            return (yield Compute(lambda: work.run_job(job), samples=samples, job=job))
        return (yield Compute(lambda: work.train(base, cmd, index), samples=samples))
    except Exception as err:  # the task's or the model's own code raised: this round goes on without us
        ctx.emit(ev.TRAIN_FAILED, round=cmd.round, error=training_error(work, err))
        return None


def _overtaken(ctx, state: _State, cmd: TrainCmd, dim: int, msg=None) -> bool:
    """Take ``msg`` (one of the controller's, if any); True if the round went on without us: a newer
    model or command, or Stop."""
    if msg is not None:
        _handle(ctx, state, msg, dim, ctx.sealer)
    return state.stop is not None or state.model_round >= cmd.round or state.cmd is not None


def _upload(ctx, cmd: TrainCmd, base, new_weights, result, params, feedback, auth: Sealer,
            priced_encode: bool = False):
    """``cmd``'s update (``new_weights`` - ``base``) encoded and sent; its bytes, or None if not finite.
    ``priced_encode``: emu prices the codec's encoding (compute.<node>.cpu.encode_s_per_mb), a request."""
    delta = new_weights - base
    if not np.isfinite(delta).all():
        # A diverged client: nothing a codec could carry; the round goes on without it.
        ctx.emit(ev.UPDATE_NOT_FINITE, round=cmd.round)
        return
    if priced_encode:
        packet = yield Compute(lambda: _encode(ctx, delta, params, feedback), kind="encode", nbytes=delta.nbytes)
    else:  # free (the default): done in place, no request, nothing moves
        packet = _encode(ctx, delta, params, feedback)
    update = ClientUpdate(
        round=cmd.round,
        seed=cmd.seed,
        client=ctx.node,
        num_samples=result.samples,
        kind="delta",
        steps=result.steps,
        loss=float(result.mean_loss),
        packet=packet,
    )
    data = messages.encode(update)
    sealed = auth.seal(CLIENT_UPDATE, cmd.round, data)
    ctx.emit(ev.UPLOAD_START, round=cmd.round, bytes=len(sealed), steps=result.steps, loss=float(result.mean_loss))
    yield Point(points.UPLOAD, cmd.round)
    yield Send(CLIENT_UPDATE, sealed, to=CONTROLLER)
    ctx.emit(ev.UPLOAD_DONE, round=cmd.round, bytes=len(sealed))
    yield Point(points.UPLOADED, cmd.round)
    return data


def _encode(ctx, delta, params, feedback) -> bytes:
    """The update's packet: ``delta`` under the codec, with error feedback's residual if it has one."""
    if feedback is None:
        return codecs.encode(delta, params)
    if getattr(feedback, "store", None) is None:
        return feedback.encode(delta)
    feedback.residual = feedback.store.take(ctx.node)  # the store's between rounds (bounded in memory)
    packet = feedback.encode(delta)
    feedback.store.put(ctx.node, feedback.residual)
    feedback.residual = None
    return packet
