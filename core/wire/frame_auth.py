"""Frames authenticated one by one, so that forged fragments never touch reassembly state.

A sealed message (``core.wire.auth``) is only checked once it is whole; until
then anyone on the domain could steer its reassembly (a forged "part 0" in an
honest sender's name used to make the receiver drop that sender's half-built
message).  With a key, every frame's payload starts with a 16-byte keyed
BLAKE2b tag over the frame's header and its chunk; the receiver checks it
before the frame counts for anything.  The frame key is derived from the run's
shared key (a different purpose, so a frame tag can never pass for a message
MAC).  Replays of honest frames are caught by the reassembler's per-sender
message ids (``real.reassembly``).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

TAG_BYTES = 16
_CONTEXT = b"dtemu-frame-1"
_NUMBERS = struct.Struct("<QIIQ")


def frame_key(key: bytes) -> bytes:
    return hmac.new(key, _CONTEXT, hashlib.sha256).digest()


def frame_tag(fkey: bytes, dds_topic: str, src: str, dst: str, tag: str, msg_id: int, part: int, parts: int,
              total: int, chunk) -> bytes:
    h = hashlib.blake2b(key=fkey, digest_size=TAG_BYTES)
    h.update(_NUMBERS.pack(msg_id, part, parts, total))
    for s in (dds_topic, src, dst, tag):
        b = s.encode()
        h.update(struct.pack("<H", len(b)))
        h.update(b)
    h.update(chunk)
    return h.digest()


def check(fkey: bytes, dds_topic: str, src: str, dst: str, tag: str, msg_id: int, part: int, parts: int,
          total: int, payload) -> memoryview | None:
    """The chunk of an authentic frame's payload, or None if its tag does not verify."""
    view = memoryview(payload)
    if len(view) < TAG_BYTES:
        return None
    want = frame_tag(fkey, dds_topic, src, dst, tag, msg_id, part, parts, total, view[TAG_BYTES:])
    return view[TAG_BYTES:] if hmac.compare_digest(bytes(view[:TAG_BYTES]), want) else None


def hello_tag(fkey: bytes, node: str, guid: str, stream: str = "") -> bytes:
    """Authenticates a presence announcement: this node name for this participant, and where its
    stream listens (real.stream; empty: none, and the tag is the one of a Hello without it)."""
    h = hashlib.blake2b(key=fkey, digest_size=TAG_BYTES, person=b"dtemu-hello")
    for s in (node, guid) + ((stream,) if stream else ()):
        b = s.encode()
        h.update(struct.pack("<H", len(b)))
        h.update(b)
    return h.digest()


def stream_tag(fkey: bytes, sender: str, receiver: str, nonce: bytes) -> bytes:
    """A stream connection's answer to its receiver's nonce (real.stream): the sender holds the key."""
    h = hashlib.blake2b(key=fkey, digest_size=TAG_BYTES, person=b"dtemu-stream")
    h.update(nonce)
    for s in (sender, receiver):
        b = s.encode()
        h.update(struct.pack("<H", len(b)))
        h.update(b)
    return h.digest()


def tick_tag(fkey: bytes, src: str, t1: int, answers) -> bytes:
    """Authenticates a clock tick (real.clock_sync): who, when, and every answer it carries
    (``answers``: (dst, t1, t2) each, in order)."""
    h = hashlib.blake2b(key=fkey, digest_size=TAG_BYTES, person=b"dtemu-tick")

    def name(s: str) -> None:
        b = s.encode()
        h.update(struct.pack("<H", len(b)))
        h.update(b)

    name(src)
    h.update(struct.pack("<QI", t1, len(answers)))
    for dst, a1, a2 in answers:
        name(dst)
        h.update(struct.pack("<QQ", a1, a2))
    return h.digest()
