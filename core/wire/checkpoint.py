"""Controller checkpoints as bytes: weights, round, and the scenario they belong to.

Layout: ``b"DTCK" | version u8 | 3 reserved | header length u32 | JSON header |
float32 weights | float64 state arrays``.  The header holds the round, the scenario
digest, the weights' length and their sha256, and (only where the server's rule keeps
state between rounds: FedAdam's moments, one value per weight; TiFL's tiers and credits, one
per client or tier) each state array's name and length and one sha256 of them all, so a
truncated or corrupted file is refused with a clear message instead of resuming from garbage.  Writing the bytes
atomically is the runtime's job (``core.rundir.atomic_write``).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np

from dtemu.core.errors import CheckpointError

MAGIC = b"DTCK"
VERSION = 1
_PREFIX = struct.Struct("<4sB3xI")
_MAX_HEADER = 1 << 20
_SMALL_STATE = 1 << 16   # a state array not one value per weight: one per client (16-bit ranks) or tier


@dataclass(frozen=True)
class Checkpoint:
    round: int
    weights: np.ndarray
    scenario_digest: str
    # Anything else worth keeping (bytes so far, failed rounds, ...).
    extra: dict = field(default_factory=dict)
    # The server rule's state between rounds (core.fl.strategy), float64 arrays by name.
    state: dict = field(default_factory=dict)


def encode_checkpoint(ckpt: Checkpoint) -> bytes:
    weights = np.ascontiguousarray(ckpt.weights, dtype="<f4")
    fields = {
        "round": ckpt.round,
        "scenario": ckpt.scenario_digest,
        "dim": int(weights.size),
        "sha256": hashlib.sha256(weights.tobytes()).hexdigest(),
        "extra": ckpt.extra,
    }
    state = b""
    if ckpt.state:  # (absent otherwise: a FedAvg checkpoint's bytes are what they were)
        arrays = {name: np.ascontiguousarray(a, dtype="<f8") for name, a in ckpt.state.items()}
        state = b"".join(a.tobytes() for a in arrays.values())
        fields["state"] = [[name, int(a.size)] for name, a in arrays.items()]
        fields["state_sha256"] = hashlib.sha256(state).hexdigest()
    header = json.dumps(fields, sort_keys=True).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(header)) + header + weights.tobytes() + state


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_checkpoint(data, *, expected_dim: int | None = None) -> Checkpoint:
    """Bytes -> Checkpoint; CheckpointError saying what is wrong for anything else.

    Every size is checked against the bytes at hand before anything is read
    or allocated: a header that claims 2^31 weights in a short file is refused
    for being truncated, not after allocating for it.
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError as e:
        raise CheckpointError(f"checkpoint is not a contiguous byte buffer: {e}") from None
    if len(view) < _PREFIX.size:
        raise CheckpointError(f"checkpoint is truncated: {len(view)} bytes, shorter than its "
                              f"{_PREFIX.size}-byte prefix")
    magic, version, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise CheckpointError(f"not a dtemu checkpoint (bad magic {bytes(magic)!r})")
    if version != VERSION:
        raise CheckpointError(f"unsupported checkpoint version {version} (expected {VERSION})")
    if header_len > _MAX_HEADER:
        raise CheckpointError(f"checkpoint header claims {header_len} bytes, more than the {_MAX_HEADER} allowed")
    if _PREFIX.size + header_len > len(view):
        raise CheckpointError(f"checkpoint is truncated: its header needs {header_len} bytes, "
                              f"{len(view) - _PREFIX.size} left")
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + header_len]))
    except (ValueError, RecursionError) as e:  # RecursionError: brackets nested thousands deep
        raise CheckpointError(f"checkpoint header is not valid JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise CheckpointError("checkpoint header is not a JSON object")
    missing = [k for k in ("round", "scenario", "dim", "sha256") if k not in header]
    if missing:
        raise CheckpointError(f"checkpoint header lacks {', '.join(missing)}")
    round_, digest, dim, sha = (header[k] for k in ("round", "scenario", "dim", "sha256"))
    extra = header.get("extra", {})
    if not (_is_int(round_) and round_ >= 0):
        raise CheckpointError(f"checkpoint header has a bad round: {str(round_)[:40]}")
    if not (_is_int(dim) and dim >= 0):
        raise CheckpointError(f"checkpoint header has a bad size: {str(dim)[:40]}")
    if not isinstance(digest, str):
        raise CheckpointError("checkpoint header's scenario digest is not a string")
    if not (isinstance(sha, str) and len(sha) == 64):
        raise CheckpointError("checkpoint header's checksum is not a sha256 hex digest")
    if not isinstance(extra, dict):
        raise CheckpointError("checkpoint header's extra is not a JSON object")
    if expected_dim is not None and dim != expected_dim:
        raise CheckpointError(f"checkpoint holds {dim} weights, the model has {expected_dim}")
    layout = _state_layout(header, dim)
    want = 4 * dim + 8 * sum(n for _, n in layout)
    body = view[_PREFIX.size + header_len :]
    if len(body) != want:
        state = "truncated" if len(body) < want else "too long"
        what = "weight and state" if layout else "weight"
        raise CheckpointError(f"checkpoint is {state}: {len(body)} of {want} {what} bytes")
    if hashlib.sha256(body[: 4 * dim]).hexdigest() != sha:
        raise CheckpointError("checkpoint weights do not match their checksum (corrupt file)")
    if layout and hashlib.sha256(body[4 * dim :]).hexdigest() != header.get("state_sha256"):
        raise CheckpointError("checkpoint state does not match its checksum (corrupt file)")
    weights = np.frombuffer(body[: 4 * dim], dtype="<f4").astype(np.float32)
    arrays, at = {}, 4 * dim
    for name, n in layout:
        arrays[name] = np.frombuffer(body[at : at + 8 * n], dtype="<f8").astype(np.float64)
        at += 8 * n
    return Checkpoint(round_, weights, digest, extra, arrays)


def _state_layout(header: dict, dim: int) -> list[tuple[str, int]]:
    """The state arrays a header names, checked: [(name, length)], each one value per weight or a
    short table (the body's length is checked against them all before anything is read)."""
    layout = header.get("state", [])
    if not isinstance(layout, list) or len(layout) > 16:
        raise CheckpointError("checkpoint header's state is not a short list")
    out = []
    for item in layout:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _is_int(item[1])
                and (item[1] == dim or 0 <= item[1] <= _SMALL_STATE)):
            raise CheckpointError(f"checkpoint header names a bad state array: {str(item)[:40]}")
        out.append((item[0], item[1]))
    return out
