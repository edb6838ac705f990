"""Authenticated messages: an HMAC-SHA256 envelope around an FL wire message.

Anyone on the same DDS domain can publish on ``train/client_update``.  With a
shared key, every FL message travels sealed::

    magic b"DTAU" | version u8 | sender length u8 | reserved u16 |
    round u32 | sequence u64 | sender | mac (32 bytes) | message

    mac = HMAC-SHA256(key, b"dtemu-auth-1" | topic | everything before the mac | message)

so the MAC covers the header (sender, round, sequence), the topic and the
payload.  A receiver rejects, with ``AuthError`` and its ``reason``:

- ``unsigned``: not an envelope, or one that is too short;
- ``forged``: the MAC does not verify (wrong key, altered bytes, another
  topic), or the envelope's sender is not the node the message came from;
- ``replayed``: a sequence number this receiver already accepted from that
  sender on that topic, or one too old to tell.

Sequence numbers start at ``incarnation << 20`` (emu: the node's start count;
real: milliseconds since the Unix epoch at process start), so a restarted node
continues above its previous life and a replay of its earlier messages stays
old.  Receivers keep, per (sender, topic), the highest number seen and the
last ``WINDOW`` below it, so reordering inside that window is tolerated.

The key never comes from the scenario (a scenario is shared and logged): the
CLIs read it from ``--key-file``, ``$DTEMU_KEY_FILE`` or ``$DTEMU_KEY`` (``host/keys.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from dtemu.core.errors import AuthError, KeyFileError

MAGIC = b"DTAU"
VERSION = 1
_HEADER = struct.Struct("<4sBBHIQ")
_MAC = 32
_CONTEXT = b"dtemu-auth-1"
WINDOW = 64
MIN_KEY_BYTES = 16
OVERHEAD_MAX = _HEADER.size + 255 + _MAC  # bytes an envelope adds, at most


@dataclass(frozen=True)
class Opened:
    data: bytes
    sender: str
    round: int
    sequence: int


class Sealer:
    """Seals what one node sends and opens what it receives.

    Without a key it does nothing: messages go as they are.
    """

    def __init__(self, key: bytes | None, node: str, incarnation: int = 0):
        self.key = key
        self.node = node
        self._sender = node.encode()
        if len(self._sender) > 255:
            raise ValueError("node name too long to seal")
        self._next: dict[str, int] = {}
        self._base = (int(incarnation) << 20) & ((1 << 64) - 1)
        self._seen: dict[tuple[str, str], tuple[int, set[int]]] = {}

    @property
    def enabled(self) -> bool:
        return self.key is not None

    def seal(self, topic: str, round_: int, data):
        """``data`` in its envelope.  A message given as its pieces (core.runtime.requests.Buffers: a
        large collective frame's header and body) is sealed as its pieces, the MAC taken over them
        one after another: joining them first, and then the envelope to them, copied every byte twice."""
        if self.key is None:
            return data
        seq = self._next.get(topic, self._base)
        self._next[topic] = seq + 1
        head = _HEADER.pack(MAGIC, VERSION, len(self._sender), 0, round_ & 0xFFFFFFFF, seq) + self._sender
        pieces = getattr(data, "parts", None)   # (Buffers, by its shape: core.runtime imports this module)
        if pieces is not None:
            return type(data)(head + _mac(self.key, topic, head, *pieces), *pieces)
        return b"".join((head, _mac(self.key, topic, head, data), data))

    def open(self, topic: str, src: str, data: bytes) -> Opened:
        """The message inside a sealed ``data`` from ``src``; AuthError if it must not be used.
        A memoryview stays one (a buffer the transport lends on the topics whose consumer sums or
        copies at once: a collective frame, 1 MiB copied for nothing otherwise); else bytes."""
        keep = isinstance(data, memoryview)
        if self.key is None:
            return Opened(data if keep else bytes(data), src, -1, -1)
        view = memoryview(data)
        if len(view) < _HEADER.size or bytes(view[:4]) != MAGIC:
            raise AuthError("unsigned", f"a message from {src!r} on {topic} carries no signature")
        magic, version, n, reserved, round_, seq = _HEADER.unpack_from(view)
        end = _HEADER.size + n
        if version != VERSION or reserved != 0 or len(view) < end + _MAC:
            raise AuthError("unsigned", f"a malformed envelope from {src!r} on {topic}")
        head, mac, body = view[:end], view[end:end + _MAC], view[end + _MAC:]
        if not hmac.compare_digest(_mac(self.key, topic, head, body), mac):
            raise AuthError("forged", f"signature of a message from {src!r} on {topic} does not verify")
        sender = bytes(view[_HEADER.size:end]).decode("utf-8", "replace")
        if sender != src:
            raise AuthError("forged", f"a message from {src!r} on {topic} is signed as {sender!r}")
        self._check_fresh(sender, topic, seq)
        return Opened(body if keep else bytes(body), sender, round_, seq)

    def _check_fresh(self, sender: str, topic: str, seq: int) -> None:
        top, recent = self._seen.get((sender, topic), (-1, set()))
        if seq in recent or seq <= top - WINDOW:
            raise AuthError("replayed", f"sequence {seq} from {sender!r} on {topic} was used before")
        if seq > top:
            recent = {s for s in recent if s > seq - WINDOW}
            top = seq
        recent.add(seq)
        self._seen[(sender, topic)] = (top, recent)


class SealingLayer:
    """What a Context lends its role for sealing (core.runtime.driver, and tests' contexts): its
    ``sealer`` seals what the role sends and opens what it receives; without a key, the identity."""

    sealer: Sealer

    @property
    def sealed(self) -> bool:
        return self.sealer.enabled

    def seal(self, topic: str, round_: int, data: bytes) -> bytes:
        """``data`` in the run's envelope (as it is, without a key)."""
        return self.sealer.seal(topic, round_, data)

    def open(self, msg) -> bytes:
        """The message inside ``msg``'s envelope; AuthError (a DecodeError with a ``reason``:
        unsigned, forged, replayed) for the role to refuse."""
        return self.sealer.open(msg.topic, msg.src, msg.data).data


def peek_inner(data: bytes) -> bytes:
    """The message inside an envelope, unverified (fault injection looks at it); else ``data``."""
    if len(data) < _HEADER.size or data[:4] != MAGIC:
        return data
    return data[_HEADER.size + data[5] + _MAC:]


def _mac(key: bytes, topic: str, head, *body) -> bytes:
    h = hmac.new(key, _CONTEXT, hashlib.sha256)
    h.update(topic.encode())
    h.update(head)
    for piece in body:
        h.update(piece)
    return h.digest()


# --- what a key is (host/keys.py reads it from a file or the environment; roles only get bytes) ---


def parse_key(raw: bytes, where: str) -> bytes:
    """A key file or variable holds 64 hex digits or at least 16 raw bytes."""
    text = raw.strip()
    try:
        key = bytes.fromhex(text.decode("ascii")) if len(text) == 64 else text
    except (UnicodeDecodeError, ValueError):
        key = text
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError(f"the key in {where} is {len(key)} bytes; use at least {MIN_KEY_BYTES} "
                        "(e.g. `python -c \"import secrets; print(secrets.token_hex(32))\"`)")
    return key
