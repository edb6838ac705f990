"""The one envelope every message of every mode starts with: 8 bytes, little-endian::

    magic b"DTEM" | version u8 | type u8 | aux u16

``type`` names the message system-wide (``TYPES``: its family and its name), so a receiver
tells a message of another family (a geo payload on FL's topic) from a malformed one of its own.
``aux`` is the type's own 16 bits: a geo payload's flag, a state reply's action, a frame's
membership generation; zero where a type has none.  The body follows, and each family reads
its own: fl (core.wire.messages), state (core.esync.state_messages), geo (core.geo.payload),
ddp (core.ddp.collectives' frames), flower (core.flower.wire).

Sealing is one layer over the whole envelope (core.wire.auth): the seal's header carries the
sender and the round, authenticated.  Unsealed, each body keeps its round and sender where it
had them before the envelope was one, so no message grew a byte: byte counts, and with them
emu's virtual times and the pinned models, stayed as they were.
"""

from __future__ import annotations

import struct
from typing import Callable

from dtemu.core.errors import DecodeError

MAGIC = b"DTEM"
VERSION = 1
HEADER = struct.Struct("<4sBBH")
SIZE = HEADER.size

FAMILIES = {
    "fl": {"train_cmd": 1, "stop": 2, "model_blob": 3, "client_update": 4, "model_delta": 5},
    # (17-21 were mode ps's parameter-server messages: not to be given again)
    "state": {"reset": 33, "report": 34, "query": 35, "response": 36, "leave": 37, "stop": 38},
    "geo": {"dense32": 49, "dense16": 50, "sparse": 51, "beat": 52, "blocks": 53, "join": 54, "state": 55,
            "end": 56},
    "ddp": {"frame": 65},
    "flower": {"instruction": 81, "reply": 82, "stop": 83},
}
# type -> (family, name)
TYPES = {t: (family, name) for family, names in FAMILIES.items() for name, t in names.items()}


def pack(type_: int, aux: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, type_, aux)


def unpack(data, family: str, fail: Callable[[str, str], Exception] = lambda _, text: DecodeError(text)):
    """(type, aux, body) of untrusted ``data``, a message of ``family``; otherwise
    ``fail(reason, text)`` is raised (each family its own error class), reason one of ``size``,
    ``magic``, ``version``, ``type``."""
    view = memoryview(data)
    if len(view) < SIZE:
        raise fail("size", f"message of {len(view)} bytes is shorter than the {SIZE}-byte envelope")
    magic, version, type_, aux = HEADER.unpack_from(view)
    if magic != MAGIC:
        raise fail("magic", f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise fail("version", f"unsupported envelope version {version}")
    got = TYPES.get(type_)
    if got is None or got[0] != family:
        what = f"a {got[0]} message ({got[1]})" if got else "unknown"
        raise fail("type", f"message type {type_} is {what}, not {family}")
    return type_, aux, view[SIZE:]
