"""ESync's state server's messages (fl.algorithm esync; core.fl.esync asks, core.esync.state_server answers).

Every message starts with the envelope of every mode (core.wire.envelope: magic, version, type,
16 bits of the type's own).  State messages (ESync's Fig. 4, family ``state``), fixed size,
little-endian::

    envelope (aux: action) | sender u16 | receiver u16 | status: k u16, i u32, r u32, c f64, m f64, t f64

``msg_type``: RESET (the controller -> SS: client k's record starts afresh at round r), REPORT
(client -> SS: it entered round r), QUERY (client -> SS: TRAIN once more or SYNC?),
RESPONSE (SS -> client, ``action`` TRAIN or SYNC); and two of our own beyond the
design's four: LEAVE (controller -> SS: client k missed round r's deadline and is left out
of the straggler search until it reports again) and STOP (controller -> SS: the run is over).
Sender and receiver are ranks.  ``decode_state`` trusts nothing: sizes, magic,
version, type, action, finite non-negative times, and raises ``StateMessageError``
with a short reason for counting.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from dtemu.core.errors import StateMessageError
from dtemu.core.wire import envelope

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
    """A client's six-tuple: rank k, local iteration i, round r, compute time c of one local
    iteration, transfer time m of an update to the controller, and the time t it was taken."""

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
