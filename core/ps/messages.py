"""Wire formats of mode ps: the state server's messages and the parameter server's.

Every message starts with the envelope of every mode (core.wire.envelope: magic, version, type,
16 bits of the type's own).  State messages (ESync's Fig. 4, family ``state``), fixed size,
little-endian::

    envelope (aux: action) | sender u16 | receiver u16 | status: k u16, i u32, r u32, c f64, m f64, t f64

``msg_type``: RESET (PS -> SS: worker k's record starts afresh at round r), REPORT
(worker -> SS: it entered round r), QUERY (worker -> SS: TRAIN once more or SYNC?),
RESPONSE (SS -> worker, ``action`` TRAIN or SYNC); and two of our own beyond the
design's four: LEAVE (PS -> SS: worker k missed round r's deadline and is left out
of the straggler search until it reports again) and STOP (PS -> SS: the run is over).
Sender and receiver are ranks.  ``decode_state`` trusts nothing: sizes, magic,
version, type, action, finite non-negative times, and raises ``StateMessageError``
with a short reason for counting.

Parameter-server messages (family ``ps``; the envelope's aux is zero):
MODEL (version u32, selected count u16, selected ranks u16..., an fp32 codec packet),
UPDATE (base version u32, worker u16, iterations u32, samples u32, loss f32, packet),
JOIN (worker u16: send me the current model), STOP (version u32), NOT_FINITE (base version
u32, worker u16, iterations u32: the worker's update from that version is not finite, so it sends
none; the server counts it and, when asynchronous, answers with its current model as for a JOIN).
An UPDATE whose vector is not finite is refused with ``NotFiniteError`` carrying the same report.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from dtemu.core.compression import codecs
from dtemu.core.errors import MessageError, NotFiniteError, StateMessageError
from dtemu.core.wire import envelope
# The FL messages' body-size checks: one wording for every message that is too short or long.
from dtemu.core.wire.messages import _at_least, _exact

# --- state messages ------------------------------------------------------------
RESET, REPORT, QUERY, RESPONSE, LEAVE, STOP = (envelope.FAMILIES["state"][k] for k in
                                              ("reset", "report", "query", "response", "leave", "stop"))
MSG_TYPES = {RESET: "RESET", REPORT: "REPORT", QUERY: "QUERY", RESPONSE: "RESPONSE", LEAVE: "LEAVE", STOP: "STOP"}
NONE, TRAIN, SYNC = 0, 1, 2
ACTIONS = {NONE: "NONE", TRAIN: "TRAIN", SYNC: "SYNC"}
_STATE = struct.Struct("<HHHIIddd")   # after the envelope
STATE_SIZE = envelope.SIZE + _STATE.size


@dataclass(frozen=True)
class Status:
    """A worker's six-tuple: rank k, local iteration i, round r, compute time c of one local
    iteration, transfer time m of an update to the PS, and the time t it was taken."""

    k: int
    i: int
    r: int
    c: float
    m: float
    t: float


@dataclass(frozen=True)
class StateMsg:
    msg_type: int
    sender: int
    receiver: int
    status: Status
    action: int = NONE


def encode_state(msg: StateMsg) -> bytes:
    st = msg.status
    return envelope.pack(msg.msg_type, msg.action) + _STATE.pack(msg.sender, msg.receiver, st.k, st.i, st.r,
                                                                 st.c, st.m, st.t)


def decode_state(data: bytes | memoryview) -> StateMsg:
    """Untrusted bytes -> StateMsg, or StateMessageError."""
    if len(data) != STATE_SIZE:
        raise StateMessageError("size", f"{len(data)} bytes, a state message has {STATE_SIZE}")
    kind, action, body = envelope.unpack(data, "state", StateMessageError)
    sender, receiver, k, i, r, c, m, t = _STATE.unpack(body)
    if action not in ACTIONS or (kind == RESPONSE) != (action != NONE):
        raise StateMessageError("action", f"action {action} with msg_type {MSG_TYPES[kind]}")
    if not (0.0 <= c < _INF and 0.0 <= m < _INF and 0.0 <= t < _INF):  # false for NaN too; one test, it is per query
        for name, value in (("c", c), ("m", m), ("t", t)):
            if not (math.isfinite(value) and value >= 0):
                raise StateMessageError("status", f"{name} = {value!r} is not a finite time >= 0")
    return StateMsg(kind, sender, receiver, Status(k, i, r, c, m, t), action)


_INF = math.inf


# --- parameter-server messages ---------------------------------------------------
_MODEL, _UPDATE, _JOIN, _STOP, _NOT_FINITE = (envelope.FAMILIES["ps"][k] for k in
                                               ("model", "update", "join", "stop", "not_finite"))
_MODEL_BODY = struct.Struct("<IH")
_UPDATE_BODY = struct.Struct("<IHIIf")
_JOIN_BODY = struct.Struct("<H")
_STOP_BODY = struct.Struct("<I")
_NOT_FINITE_BODY = struct.Struct("<IHI")
FP32 = codecs.CodecParams("fp32")


@dataclass(frozen=True)
class Model:
    version: int  # global model version (the round it starts)
    weights: np.ndarray
    selected: tuple[int, ...] = ()  # ranks asked to train on it (TiFL); empty: everyone


@dataclass(frozen=True)
class Update:
    version: int  # the global version it was trained from
    worker: int  # rank
    iterations: int
    samples: int
    loss: float
    delta: np.ndarray


@dataclass(frozen=True)
class Join:
    worker: int


@dataclass(frozen=True)
class PsStop:
    version: int


@dataclass(frozen=True)
class NotFinite:
    """A worker's update from ``version`` came out not finite (its training diverged): no update."""

    version: int
    worker: int
    iterations: int


def _head(kind: int) -> bytes:
    return envelope.pack(kind)


def encode_ps(msg) -> bytes:
    if isinstance(msg, Model):
        return b"".join((_head(_MODEL), _MODEL_BODY.pack(msg.version, len(msg.selected)),
                         struct.pack(f"<{len(msg.selected)}H", *msg.selected), codecs.encode(msg.weights, FP32)))
    if isinstance(msg, Update):
        return b"".join((_head(_UPDATE), _UPDATE_BODY.pack(msg.version, msg.worker, msg.iterations, msg.samples,
                                                           msg.loss), codecs.encode(msg.delta, FP32)))
    if isinstance(msg, Join):
        return _head(_JOIN) + _JOIN_BODY.pack(msg.worker)
    if isinstance(msg, PsStop):
        return _head(_STOP) + _STOP_BODY.pack(msg.version)
    if isinstance(msg, NotFinite):
        return _head(_NOT_FINITE) + _NOT_FINITE_BODY.pack(msg.version, msg.worker, msg.iterations)
    raise TypeError(f"not a ps message: {type(msg).__name__}")


def decode_ps(data: bytes | memoryview, dim: int):
    """Untrusted bytes -> Model | Update | Join | PsStop | NotFinite, or MessageError (CodecError for
    a bad vector; a vector of another length than ``dim`` is refused too, and one not finite with
    NotFiniteError, whose ``report`` is an update's NotFinite)."""
    kind, reserved, body = envelope.unpack(data, "ps", lambda _, text: MessageError(text))
    if reserved:
        raise MessageError("reserved header bits set")
    if kind == _MODEL:
        _at_least(body, _MODEL_BODY.size, "Model")
        ver, n = _MODEL_BODY.unpack_from(body)
        end = _MODEL_BODY.size + 2 * n
        _at_least(body, end, "Model")
        selected = struct.unpack_from(f"<{n}H", body, _MODEL_BODY.size)
        return Model(ver, _vector(body[end:], dim), tuple(selected))
    if kind == _UPDATE:
        _at_least(body, _UPDATE_BODY.size, "Update")
        ver, worker, iterations, samples, loss = _UPDATE_BODY.unpack_from(body)
        try:
            delta = _vector(body[_UPDATE_BODY.size:], dim)
        except NotFiniteError as err:
            raise NotFiniteError(f"update from version {ver}: {err}", NotFinite(ver, worker, iterations)) from None
        return Update(ver, worker, iterations, samples, loss, delta)
    if kind == _JOIN:
        _exact(body, _JOIN_BODY.size, "Join")
        return Join(*_JOIN_BODY.unpack(body))
    if kind == _STOP:
        _exact(body, _STOP_BODY.size, "Stop")
        return PsStop(*_STOP_BODY.unpack(body))
    if kind == _NOT_FINITE:
        _exact(body, _NOT_FINITE_BODY.size, "NotFinite")
        return NotFinite(*_NOT_FINITE_BODY.unpack(body))
    raise MessageError(f"unknown ps message type {kind}")


def _vector(packet: memoryview, dim: int) -> np.ndarray:
    vec = codecs.decode(bytes(packet), expected_dim=dim).to_dense()
    if not np.isfinite(vec).all():
        raise NotFiniteError("vector is not finite")
    return vec
