"""The wire types of real mode: every IDL type that goes over CycloneDDS lives here.

``Frame`` carries one piece (at most ~1 MiB, see ``real.transport``) of a message::

    src     node name of the sender
    dst     node name of the addressee, "" = everyone
    topic   logical topic / tag of the message (usually the DDS topic's name)
    msg_id  per-sender message number (monotonic for one sender)
    part    index of this piece, 0 <= part < parts
    parts   number of pieces of the message
    total   bytes of the whole message
    payload the bytes of this piece (IDL ``sequence<octet>``)

``Hello`` is the presence announcement (topic ``ctl/hello``, keyed on the node
name, TRANSIENT_LOCAL) that lets peers list each other by name.

Fast path
---------
cyclonedds-python's stock serializer handles a ``sequence[uint8]`` element by
element (10-35 MB/s).  ``Frame`` overrides ``serialize`` / ``deserialize``
with a hand-written encoder that produces the *same bytes* (plain CDR, XCDR1
by default, XCDR2 on request, either endianness: the layout of a final struct
of three strings, two uint64, two uint32 and a sequence of octets), copying the
payload as one slice.  ``tests/test_dds_wire.py`` compares it byte for byte with
the stock machinery (``Frame.__idl__``), so a cyclonedds upgrade that changes
the format fails that test instead of corrupting data.

``decode_frame(data, copy=False)`` returns the payload as a ``memoryview`` of
``data`` (no copy); the transport uses it to reassemble messages with a single
copy.  Decoding is strict: anything that is not a well-formed ``Frame`` raises
``WireError`` (the transport counts and drops such samples).
"""

# No ``from __future__ import annotations`` here: cyclonedds resolves the IDL field
# annotations at run time and cannot resolve string annotations.
import struct
from dataclasses import dataclass, field

from cyclonedds.idl import IdlStruct
from cyclonedds.idl._support import Endianness
from cyclonedds.idl.annotations import key
from cyclonedds.idl.types import sequence, uint8, uint32, uint64

from dtemu.core.errors import DecodeError

__all__ = ["Frame", "Hello", "INVALID_HELLO", "Tick", "INVALID_TICK", "WireError", "encode_frame", "decode_frame", "valid_name"]


class WireError(DecodeError):
    """The bytes are not a well-formed serialized Frame (a DecodeError, so a ValueError too)."""


@dataclass
class Frame(IdlStruct, typename="dtemu.Frame"):
    src: str = ""
    dst: str = ""
    topic: str = ""
    msg_id: uint64 = 0
    part: uint32 = 0
    parts: uint32 = 1
    total: uint64 = 0
    payload: sequence[uint8] = b""
    # The key makes a TRANSIENT_LOCAL writer with a KEEP_LAST 1 durability-service history
    # keep one frame per part index, i.e. the frames of its last message (see real.transport).
    # Keys do not change the serialized data of a final struct.
    key("part")

    # --- fast path, same bytes as the stock serializer -------------------------------------
    def serialize(self, buffer=None, endianness: Endianness | None = None,
                  use_version_2: bool | None = None) -> bytes:
        if buffer is not None:  # caller wants the stock Buffer protocol: leave it to the machinery
            return self.__idl__.serialize(self, buffer=buffer, endianness=endianness,
                                          use_version_2=use_version_2)
        return encode_frame(self, endianness=endianness, use_version_2=use_version_2)

    @classmethod
    def deserialize(cls, data, has_header: bool = True, use_version_2: bool | None = None) -> "Frame":
        if not has_header:
            return cls.__idl__.deserialize(data, has_header=False, use_version_2=use_version_2)
        if use_version_2 is not None:  # same rule as the stock deserializer
            raise Exception("Considered programmer error to set a version of xcdr to use if a header is present in the data.")
        return decode_frame(data, copy=True)


@dataclass
class Hello(IdlStruct, typename="dtemu.Hello"):
    """Presence: one instance per participant (keyed on ``guid``, its GUID as str(uuid)), so
    that nobody can replace another participant's announcement by claiming its name.

    Anyone on the domain can publish a Hello.  A sample that does not decode
    (bad UTF-8 in a name) or names no sensible node decodes as ``INVALID_HELLO``
    (``node == ""``), which every reader skips and counts, instead of raising
    inside a batch read and taking every honest peer's sample with it.  In a
    sealed run ``tag`` authenticates (node, guid, stream) (``core.wire.frame_auth.hello_tag``).
    ``stream``: where the node's stream of large payloads listens (``real.stream``), or empty."""
    node: str
    guid: str = ""
    key("guid")
    pid: uint32 = 0
    host: str = ""
    tag: sequence[uint8] = b""
    stream: str = ""

    @classmethod
    def deserialize(cls, data, has_header: bool = True, use_version_2: bool | None = None) -> "Hello":
        hello = _lenient(cls, data, has_header, use_version_2)
        return hello if hello is not None and valid_name(hello.node) and len(hello.guid) <= MAX_NAME \
            else INVALID_HELLO


def _lenient(cls, data, has_header: bool, use_version_2: bool | None):
    """A control sample (Hello, Tick) by the stock decoder, its ``tag`` as bytes; None for anything
    it refuses (bad UTF-8 and the rest), so that one bad sample cannot raise inside a batch read."""
    try:
        sample = cls.__idl__.deserialize(data, has_header=has_header, use_version_2=use_version_2)
    except Exception:
        return None
    sample.tag = bytes(sample.tag)
    return sample


MAX_NAME = 128  # node names and GUID strings; a real one is far shorter


def valid_name(name) -> bool:
    """A node name a peer may carry: non-empty, at most MAX_NAME characters, printable."""
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME and name.isprintable()


INVALID_HELLO = Hello(node="")


@dataclass
class TickAnswer(IdlStruct, typename="dtemu.TickAnswer"):
    """One peer's ping answered: its ``t1`` echoed, and ``t2``, when the answerer took it (its clock)."""
    dst: str
    t1: uint64 = 0
    t2: uint64 = 0


MAX_TICK_ANSWERS = 4096  # a tick answers at most this many peers (real.clock_sync keeps as many clocks)


@dataclass
class Tick(IdlStruct, typename="dtemu.Tick"):
    """A node's clock tick (real.clock_sync): a ping at ``t1`` (its wall clock, ns) that also
    answers every ping it has taken since its last tick, one ``TickAnswer`` a peer; ``t1`` is each
    answer's ``t3``.  One sample a node a tick, so each node takes N - 1 a period where answers on
    their own were N^2.  In a sealed run ``tag`` authenticates the rest
    (``core.wire.frame_auth.tick_tag``).  Anything that does not decode, or names no sensible node,
    decodes as ``INVALID_TICK`` (``src == ""``)."""
    src: str
    t1: uint64 = 0
    answers: sequence[TickAnswer, MAX_TICK_ANSWERS] = field(default_factory=list)
    tag: sequence[uint8] = b""

    @classmethod
    def deserialize(cls, data, has_header: bool = True, use_version_2: bool | None = None) -> "Tick":
        tick = _lenient(cls, data, has_header, use_version_2)
        ok = tick is not None and valid_name(tick.src) and all(valid_name(a.dst) for a in tick.answers)
        return tick if ok else INVALID_TICK


INVALID_TICK = Tick(src="")


# ---------------------------------------------------------------------------------------------
# Encoder / decoder

_HEAD_CACHE: dict[bool, tuple[int, int]] = {}


def _encapsulation(v2: bool) -> int:
    """Encapsulation kind byte (without the endianness bit) the stock serializer writes."""
    idl = Frame.__idl__
    if not idl._populated:
        idl.populate()
    return idl.xcdrv2_head if v2 else idl.xcdrv1_head


_DEFAULT_V2: list[bool] = []


def _default_v2() -> bool:
    if _DEFAULT_V2:
        return _DEFAULT_V2[0]
    idl = Frame.__idl__
    if not idl._populated:
        idl.populate()
    _DEFAULT_V2.append(idl.default_version == 2)
    return _DEFAULT_V2[0]


def _payload_view(payload) -> memoryview | bytes:
    if isinstance(payload, (bytes, bytearray)):
        return payload
    if isinstance(payload, memoryview):
        return payload if (payload.format == "B" and payload.ndim == 1) else payload.cast("B")
    if payload is None:
        return b""
    return bytes(payload)  # list of ints (what the stock deserializer returns)


def encode_frame(f: Frame, endianness: Endianness | None = None, use_version_2: bool | None = None,
                 pad4: bool = False) -> bytes:
    """Serialize ``f`` exactly as ``Frame.__idl__.serialize`` would, with one copy of the payload.

    ``pad4`` appends the zero bytes up to a multiple of 4 that ``DataWriter.write`` adds
    before handing a sample to CycloneDDS (saves it a second copy)."""
    v2 = _default_v2() if use_version_2 is None else bool(use_version_2)
    little = (endianness or Endianness.native()) == Endianness.Little
    return encode_parts(f.src, f.dst, f.topic, f.msg_id, f.part, f.parts, f.total, f.payload, v2, little, pad4)


# (src, dst, topic, v2, little) -> the bytes up to msg_id: encapsulation header, the three strings,
# the padding after them.  A node sends with a handful of (src, dst, topic): each frame packs
# only its numbers behind a cached prefix (a quarter of the time of building it, per message
# of the state server's round trip, docs/notebook/).  Bounded: cleared when full.
_PREFIXES: dict[tuple, bytes] = {}
_MAX_PREFIXES = 4096
_TAIL = {True: struct.Struct("<QIIQI"), False: struct.Struct(">QIIQI")}  # msg_id part parts total len(payload)


def _prefix(src: str, dst: str, topic: str, v2: bool, little: bool) -> bytes:
    e = "<" if little else ">"
    align8 = 4 if v2 else 8  # XCDR2 caps alignment at 4
    head = bytearray(4)
    head[1] = _encapsulation(v2) | (1 if little else 0)
    for s in (src, dst, topic):
        b = s.encode("utf-8")
        head.extend(b"\0" * ((-(len(head) - 4)) % 4))
        head += struct.pack(e + "I", len(b) + 1)
        head += b
        head += b"\0"
    # msg_id at an 8-aligned offset (4 in XCDR2); part and parts keep total 8-aligned: no padding
    # further on (offsets relative to the end of the 4-byte encapsulation header)
    head.extend(b"\0" * ((-(len(head) - 4)) % align8))
    return bytes(head)


def encode_parts(src: str, dst: str, topic: str, msg_id: int, part: int, parts: int, total: int, payload,
                 v2: bool | None = None, little: bool | None = None, pad4: bool = False) -> bytes:
    """``encode_frame`` of a Frame with these fields, without building the Frame (the transport's
    send path); ``v2`` / ``little`` default to the stock serializer's choice (XCDR1 unless the
    type says otherwise, native byte order)."""
    if v2 is None:
        v2 = _default_v2()
    if little is None:
        little = _NATIVE_LITTLE
    key = (src, dst, topic, v2, little)
    prefix = _PREFIXES.get(key)
    if prefix is None:
        prefix = _prefix(src, dst, topic, v2, little)
        if len(_PREFIXES) >= _MAX_PREFIXES:
            _PREFIXES.clear()
        _PREFIXES[key] = prefix
    payload = _payload_view(payload)
    n = len(payload)
    head = prefix + _TAIL[little].pack(msg_id, part, parts, total, n)
    if not n:
        return head
    if pad4 and n % 4:
        return b"".join((head, payload, b"\0" * (-n % 4)))  # head is a multiple of 4 long
    return b"".join((head, payload))


_NATIVE_LITTLE = Endianness.native() == Endianness.Little


_U32 = {True: struct.Struct("<I"), False: struct.Struct(">I")}
_KNOWN_KINDS = {0x00, 0x01, 0x06, 0x07}  # CDR_BE, CDR_LE, CDR2_BE, CDR2_LE (final struct)


def decode_frame(data, copy: bool = True) -> Frame:
    """Parse a serialized Frame (with its 4-byte encapsulation header).

    ``copy=False`` leaves the payload as a memoryview into ``data``.  Raises
    ``WireError`` on anything malformed (bad header, truncated, bad string).
    """
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    n = len(mv)
    if n < 4:
        raise WireError("shorter than the encapsulation header")
    kind = mv[1]
    if mv[0] != 0 or kind not in _KNOWN_KINDS:
        raise WireError(f"unsupported encapsulation {bytes(mv[:2]).hex()}")
    little = bool(kind & 1)
    u32 = _U32[little]
    pos = 4  # absolute; alignment counts from 4 (the end of the encapsulation header)
    try:
        strs = []
        for _ in range(3):
            pos += (4 - pos) % 4
            (ln,) = u32.unpack_from(mv, pos)
            pos += 4
            end = pos + ln
            if ln < 1 or end > n:
                raise WireError("bad string length")
            if mv[end - 1] != 0:
                raise WireError("string not NUL-terminated")
            strs.append(str(mv[pos:end - 1], "utf-8"))
            pos = end
        pos += (4 - pos) % (4 if kind > 3 else 8)  # XCDR2 caps alignment at 4
        # msg_id, part, parts, total, payload length: no padding between them (see encode_parts)
        msg_id, part, parts, total, plen = _TAIL[little].unpack_from(mv, pos)
        pos += 28
    except struct.error as exc:
        raise WireError(f"truncated frame: {exc}") from None
    except UnicodeDecodeError as exc:
        raise WireError(f"bad utf-8 in a string: {exc}") from None
    if pos + plen > n:
        raise WireError("payload runs past the end of the sample")
    payload = mv[pos:pos + plen]
    if copy:
        payload = payload.tobytes()
    return Frame(src=strs[0], dst=strs[1], topic=strs[2], msg_id=msg_id, part=part,
                 parts=parts, total=total, payload=payload)
