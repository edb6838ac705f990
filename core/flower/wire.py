"""A Flower Message on dtemu's wire, and back: untrusted bytes in, a checked Message out.

Frame: the envelope of every mode (core.wire.envelope: its type an instruction, a reply, or Stop;
aux zero), then the Message as Flower's own protobuf (flwr.common.serde), so its size on the wire is the size Flower's
transport would carry.  Sealing is the driver's layer over the frame (core.wire.auth), as for every
mode.  Anything that does not decode, or a reply whose arrays do not load, is not finite, or does not
match the arrays its instruction carried, raises DecodeError with a reason: the role refuses and counts
it, and the app never sees it.  Flower is imported on first use (an optional extra: dtemu[flower]).
"""

from __future__ import annotations

import hashlib

import numpy as np

from dtemu.core.errors import DecodeError
from dtemu.core.wire import envelope

INSTRUCTION, REPLY, STOP = (envelope.FAMILIES["flower"][k] for k in ("instruction", "reply", "stop"))


def encode(kind: int, message=None, content=None) -> bytes:
    """``message`` (a flwr Message; None for STOP) framed as ``kind``; ``content``: its content's
    protobuf already made (``content_of``), for a content that goes to many nodes."""
    if kind == STOP:
        return envelope.pack(STOP)
    from flwr.common.serde import message_to_proto, metadata_to_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage

    if content is None:
        proto = message_to_proto(message)
    else:
        proto = ProtoMessage(metadata=metadata_to_proto(message.metadata), content=content)
    return envelope.pack(kind) + proto.SerializeToString()


def content_of(message) -> tuple:
    """(the protobuf of ``message``'s content or None, its arrays: ``arrays_of``)."""
    if not message.has_content():
        return None, {}
    from flwr.common.serde import recorddict_to_proto

    return recorddict_to_proto(message.content), arrays_of(message, strict=False)


def kind_of(data: bytes) -> int:
    """The frame's kind; DecodeError if it is not a frame of this version."""
    kind, aux, _ = envelope.unpack(data, "flower", lambda _, text: DecodeError(f"not a Flower frame: {text}"))
    if aux:
        raise DecodeError("not a Flower frame: reserved header bits set")
    return kind


def decode(data: bytes):
    """The Message in an INSTRUCTION or REPLY frame; DecodeError if its bytes are not one."""
    from flwr.common.serde import message_from_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage

    try:
        return message_from_proto(ProtoMessage.FromString(bytes(data[envelope.SIZE:])))
    except Exception as err:  # protobuf's DecodeError, or a field Flower will not take
        raise DecodeError(f"not a Flower message: {type(err).__name__}: {err}") from None


def arrays_of(message, strict: bool = True) -> dict[str, dict[str, np.ndarray]]:
    """Every array of ``message``'s content as numpy, by record and key; DecodeError if one does not
    load, holds another dtype or shape than it declares, or is a float array with NaN or inf.
    (Flower's legacy Parameters declare neither: an empty dtype is not checked.)  ``strict`` False:
    what does not load is left out instead (the server's own instructions: the app's business)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    if not message.has_content():
        return out
    for name, record in message.content.array_records.items():
        out[name] = {}
        for key, array in record.items():
            try:
                value = array.numpy()
                if array.dtype and (list(value.shape) != list(array.shape) or str(value.dtype) != array.dtype):
                    raise DecodeError(f"array {name}.{key} says {array.dtype}{list(array.shape)} but holds "
                                      f"{value.dtype}{list(value.shape)}")
                if value.dtype.kind in "fc" and not np.isfinite(value).all():
                    raise DecodeError(f"array {name}.{key} is not finite (NaN or inf)")
            except Exception as err:
                if not strict:
                    continue
                if isinstance(err, DecodeError):
                    raise
                raise DecodeError(f"array {name}.{key} does not load: {type(err).__name__}: {err}") from None
            out[name][key] = value
    return out


def check_reply(reply, asked: dict[str, dict[str, np.ndarray]]) -> None:
    """A reply's arrays must load, be finite, and match in shape and dtype the arrays of the same
    record and key its instruction carried (``asked``: ``arrays_of`` the instruction)."""
    got = arrays_of(reply)
    for name, record in got.items():
        sent = asked.get(name)
        if not sent:
            continue
        if set(record) != set(sent):
            raise DecodeError(f"record {name} holds keys {sorted(record)[:5]}, not those it was sent")
        for key, value in record.items():
            if value.shape != sent[key].shape or value.dtype != sent[key].dtype:
                raise DecodeError(f"array {name}.{key} is {value.dtype}{list(value.shape)}, sent as "
                                  f"{sent[key].dtype}{list(sent[key].shape)}")


def model_sha256(arrays: dict[str, np.ndarray]) -> str:
    """The sha256 of a model's arrays, in order, as little-endian bytes (the summary's model_sha256)."""
    digest = hashlib.sha256()
    for value in arrays.values():
        digest.update(np.ascontiguousarray(value).astype(value.dtype.newbyteorder("<"), copy=False).tobytes())
    return digest.hexdigest()
