"""Controller checkpoints as bytes: weights, round, and the scenario they belong to.

Layout: ``b"DTCK" | version u8 | 3 reserved | header length u32 | JSON header |
float32 weights``.  The header holds the round, the scenario digest, the
weights' length and their sha256, so a truncated or corrupted file is refused
with a clear message instead of resuming from garbage.  Writing the bytes
atomically is the runtime's job (``core.rundir.atomic_write``).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np

from .errors import CheckpointError

MAGIC = b"DTCK"
VERSION = 1
_PREFIX = struct.Struct("<4sB3xI")
_MAX_HEADER = 1 << 20


@dataclass(frozen=True)
class Checkpoint:
    round: int
    weights: np.ndarray
    scenario_digest: str
    # Anything else worth keeping (bytes so far, failed rounds, ...).
    extra: dict = field(default_factory=dict)


def encode_checkpoint(ckpt: Checkpoint) -> bytes:
    weights = np.ascontiguousarray(ckpt.weights, dtype="<f4")
    header = json.dumps(
        {
            "round": ckpt.round,
            "scenario": ckpt.scenario_digest,
            "dim": int(weights.size),
            "sha256": hashlib.sha256(weights.tobytes()).hexdigest(),
            "extra": ckpt.extra,
        },
        sort_keys=True,
    ).encode()
    return _PREFIX.pack(MAGIC, VERSION, len(header)) + header + weights.tobytes()


def decode_checkpoint(data: bytes, *, expected_dim: int | None = None) -> Checkpoint:
    if len(data) < _PREFIX.size:
        raise CheckpointError(f"checkpoint is truncated ({len(data)} bytes)")
    magic, version, header_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError("not a dtemu checkpoint (bad magic)")
    if version != VERSION:
        raise CheckpointError(f"unsupported checkpoint version {version}")
    if header_len > _MAX_HEADER or _PREFIX.size + header_len > len(data):
        raise CheckpointError("checkpoint header is truncated or oversized")
    try:
        header = json.loads(data[_PREFIX.size : _PREFIX.size + header_len])
        round_, digest, dim, sha = (header[k] for k in ("round", "scenario", "dim", "sha256"))
        extra = header.get("extra", {})
    except (ValueError, KeyError, TypeError):
        raise CheckpointError("checkpoint header is not valid") from None
    if not (isinstance(round_, int) and isinstance(dim, int) and round_ >= 0 and dim >= 0):
        raise CheckpointError("checkpoint header has a bad round or size")
    if expected_dim is not None and dim != expected_dim:
        raise CheckpointError(f"checkpoint holds {dim} weights, the model has {expected_dim}")
    body = data[_PREFIX.size + header_len :]
    if len(body) != 4 * dim:
        raise CheckpointError(f"checkpoint is truncated: {len(body)} of {4 * dim} weight bytes")
    if hashlib.sha256(body).hexdigest() != sha:
        raise CheckpointError("checkpoint weights do not match their checksum (corrupt file)")
    weights = np.frombuffer(body, dtype="<f4").astype(np.float32)
    return Checkpoint(round_, weights, str(digest), extra if isinstance(extra, dict) else {})
