"""Wire messages of federated learning, as bytes.

Every message starts with the envelope of every mode (core.wire.envelope: magic, version, type,
and 16 bits that FL leaves zero), followed by the fields of its type.  ``decode`` validates lengths and values
and raises ``MessageError`` for anything malformed; the codec packet inside a
``ClientUpdate`` or ``ModelBlob`` is left as bytes for ``core.codecs.decode``
(which the receiver calls with the model's size).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from dtemu.core.errors import MessageError
from dtemu.core.wire import envelope

_TYPES = envelope.FAMILIES["fl"]
_TRAIN_CMD, _STOP, _MODEL_BLOB, _CLIENT_UPDATE, _MODEL_DELTA = (
    _TYPES[k] for k in ("train_cmd", "stop", "model_blob", "client_update", "model_delta"))

UPDATE_KINDS = ("delta", "weights")
MAX_NAME = 64


@dataclass(frozen=True)
class TrainCmd:
    round: int
    subset: int  # samples per client this round; 0: all of its data
    epochs: int
    lr: float
    seed: int


@dataclass(frozen=True)
class Stop:
    """The run is over (after ``round``); clients exit."""

    round: int
    reason: str = ""


@dataclass(frozen=True)
class ModelBlob:
    round: int  # the model after this round (0: the initial model)
    packet: bytes  # a codec packet (fp32) of the flat weights
    sha256: str  # of the packet, so a receiver can tell a damaged blob

    @classmethod
    def of(cls, round_: int, packet: bytes) -> "ModelBlob":
        return cls(round_, packet, hashlib.sha256(packet).hexdigest())


@dataclass(frozen=True)
class ModelDelta:
    """The model after ``round`` as a change to the one after ``base`` (fl.downlink_codec):
    a client holding model ``base`` adds the decoded packet; any other client cannot use it."""

    round: int
    base: int
    packet: bytes  # a codec packet of (model - base model)
    sha256: str  # of the packet

    @classmethod
    def of(cls, round_: int, base: int, packet: bytes) -> "ModelDelta":
        return cls(round_, base, packet, hashlib.sha256(packet).hexdigest())


@dataclass(frozen=True)
class ClientUpdate:
    round: int
    seed: int  # the TrainCmd's seed, echoed: tells a retried round from its first attempt
    client: str
    num_samples: int
    kind: str  # "delta" or "weights"
    steps: int
    loss: float
    packet: bytes  # a codec packet


_TRAIN_CMD_BODY = struct.Struct("<IIHdQ")
_STOP_BODY = struct.Struct("<IH")
_BLOB_BODY = struct.Struct("<I32s")
_DELTA_BODY = struct.Struct("<II32s")
_UPDATE_BODY = struct.Struct("<IQIBIfB")  # round, seed, num_samples, kind, steps, loss, name length


def encode(msg) -> bytes:
    if isinstance(msg, TrainCmd):
        return _header(_TRAIN_CMD) + _TRAIN_CMD_BODY.pack(
            msg.round, msg.subset, msg.epochs, msg.lr, msg.seed
        )
    if isinstance(msg, Stop):
        reason = msg.reason.encode()[:1024]
        return _header(_STOP) + _STOP_BODY.pack(msg.round, len(reason)) + reason
    if isinstance(msg, ModelBlob):
        return b"".join(
            (_header(_MODEL_BLOB), _BLOB_BODY.pack(msg.round, bytes.fromhex(msg.sha256)), msg.packet)
        )
    if isinstance(msg, ModelDelta):
        return b"".join((_header(_MODEL_DELTA), _DELTA_BODY.pack(msg.round, msg.base, bytes.fromhex(msg.sha256)),
                         msg.packet))
    if isinstance(msg, ClientUpdate):
        name = msg.client.encode()
        if not 0 < len(name) <= MAX_NAME:
            raise ValueError(f"client name must be 1..{MAX_NAME} bytes")
        body = _UPDATE_BODY.pack(
            msg.round,
            msg.seed,
            msg.num_samples,
            UPDATE_KINDS.index(msg.kind),
            msg.steps,
            msg.loss,
            len(name),
        )
        return b"".join((_header(_CLIENT_UPDATE), body, name, msg.packet))
    raise TypeError(f"not a wire message: {type(msg).__name__}")


def decode(data: bytes | memoryview):
    """Bytes -> TrainCmd | Stop | ModelBlob | ModelDelta | ClientUpdate, or MessageError."""
    kind, reserved, body = envelope.unpack(data, "fl", lambda _, text: MessageError(text))
    if reserved != 0:
        raise MessageError("reserved header bits set")
    if kind == _TRAIN_CMD:
        _exact(body, _TRAIN_CMD_BODY.size, "TrainCmd")
        round_, subset, epochs, lr, seed = _TRAIN_CMD_BODY.unpack(body)
        if not (lr > 0 and lr < float("inf")):
            raise MessageError(f"TrainCmd lr must be a finite positive number, got {lr}")
        return TrainCmd(round_, subset, epochs, lr, seed)
    if kind == _STOP:
        _at_least(body, _STOP_BODY.size, "Stop")
        round_, n = _STOP_BODY.unpack_from(body)
        _exact(body, _STOP_BODY.size + n, "Stop")
        return Stop(round_, _text(body[_STOP_BODY.size :], "Stop reason"))
    if kind == _MODEL_BLOB:
        _at_least(body, _BLOB_BODY.size, "ModelBlob")
        round_, digest = _BLOB_BODY.unpack_from(body)
        packet = bytes(body[_BLOB_BODY.size :])
        if hashlib.sha256(packet).digest() != digest:
            raise MessageError("ModelBlob checksum does not match its payload")
        return ModelBlob(round_, packet, digest.hex())
    if kind == _MODEL_DELTA:
        _at_least(body, _DELTA_BODY.size, "ModelDelta")
        round_, base, digest = _DELTA_BODY.unpack_from(body)
        if base >= round_:
            raise MessageError(f"ModelDelta of round {round_} on base {base}: the base must be older")
        packet = bytes(body[_DELTA_BODY.size :])
        if hashlib.sha256(packet).digest() != digest:
            raise MessageError("ModelDelta checksum does not match its payload")
        return ModelDelta(round_, base, packet, digest.hex())
    if kind == _CLIENT_UPDATE:
        _at_least(body, _UPDATE_BODY.size, "ClientUpdate")
        round_, seed, samples, kind_id, steps, loss, n = _UPDATE_BODY.unpack_from(body)
        if kind_id >= len(UPDATE_KINDS):
            raise MessageError(f"ClientUpdate kind {kind_id} is unknown")
        if not 0 < n <= MAX_NAME:
            raise MessageError(f"ClientUpdate client name length {n} out of range")
        _at_least(body, _UPDATE_BODY.size + n, "ClientUpdate")
        name = _text(body[_UPDATE_BODY.size : _UPDATE_BODY.size + n], "ClientUpdate client name")
        packet = bytes(body[_UPDATE_BODY.size + n :])
        return ClientUpdate(round_, seed, name, samples, UPDATE_KINDS[kind_id], steps, loss, packet)
    raise MessageError(f"unknown message type {kind}")


def _header(kind: int) -> bytes:
    return envelope.pack(kind)


def _exact(body: memoryview, size: int, what: str) -> None:
    if len(body) != size:
        raise MessageError(f"{what} body is {len(body)} bytes, expected {size}")


def _at_least(body: memoryview, size: int, what: str) -> None:
    if len(body) < size:
        raise MessageError(f"{what} body is {len(body)} bytes, shorter than {size}")


def _text(raw: memoryview, what: str) -> str:
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise MessageError(f"{what} is not UTF-8") from None
