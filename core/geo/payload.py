"""The bytes of geo traffic: a gradient (or weights), dense or sparse, of one round.

    magic "GEO1" | kind u8 | reserved u8 u16 | round u32 | dim u32 | count u32 | body

- DENSE32 / DENSE16: ``count == dim`` values, float32 or float16 (FP16: every
  dense transfer in half precision);
- BEAT: a heartbeat (``count`` 0, no body): the sender is alive (``geo.heartbeat_s``);
- SPARSE: ``count`` (index, value) pairs, indices u32 strictly ascending
  (so never repeated) and below ``dim``, then ``count`` float32 values (the
  sparse traffic between parameter servers stays fp32).

Every byte off the wire is untrusted: ``decode`` checks the magic, that the
body is exactly as long as the header says, the dimension the receiver
expects, index range and order, and finite values; anything else is a
``GeoPayloadError`` (a ``DecodeError``) that the receiving role counts and
never applies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from dtemu.core.errors import GeoPayloadError

MAGIC = b"GEO1"
HEADER = struct.Struct("<4sBBHIII")
DENSE32, DENSE16, SPARSE, BEAT = 1, 2, 3, 4
KIND_NAMES = {DENSE32: "dense32", DENSE16: "dense16", SPARSE: "sparse", BEAT: "beat"}


@dataclass(frozen=True)
class Payload:
    kind: int
    round: int
    dim: int
    values: np.ndarray            # float32: dense, dim values; sparse, count values
    indices: np.ndarray | None    # sparse: int64 positions, ascending

    @property
    def sparse(self) -> bool:
        return self.kind == SPARSE

    def dense(self) -> np.ndarray:
        """The dim-long float32 vector (zeros where a sparse payload sends nothing)."""
        if not self.sparse:
            return self.values
        out = np.zeros(self.dim, np.float32)
        out[self.indices] = self.values
        return out


def encode_dense(round_: int, vec: np.ndarray, fp16: bool = False) -> bytes:
    vec = np.ascontiguousarray(vec, dtype=np.float16 if fp16 else np.float32)
    return HEADER.pack(MAGIC, DENSE16 if fp16 else DENSE32, 0, 0, round_, vec.size, vec.size) + vec.tobytes()


def encode_sparse(round_: int, dim: int, indices: np.ndarray, values: np.ndarray) -> bytes:
    idx = np.ascontiguousarray(indices, dtype="<u4")
    vals = np.ascontiguousarray(values, dtype="<f4")
    if idx.shape != vals.shape or idx.ndim != 1:
        raise ValueError("indices and values must be two 1-D arrays of one length")
    return HEADER.pack(MAGIC, SPARSE, 0, 0, round_, dim, idx.size) + idx.tobytes() + vals.tobytes()


def encode_beat(dim: int) -> bytes:
    return HEADER.pack(MAGIC, BEAT, 0, 0, 0, dim, 0)


def decode(data: bytes, dim: int) -> Payload:
    """The payload in ``data``, for a receiver whose vectors have ``dim`` entries."""
    if len(data) < HEADER.size:
        raise GeoPayloadError(f"{len(data)} bytes: shorter than the {HEADER.size}-byte header")
    magic, kind, _, _, round_, pdim, count = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise GeoPayloadError(f"bad magic {magic!r}")
    if pdim != dim:
        raise GeoPayloadError(f"dimension {pdim}, expected {dim}")
    body = memoryview(data)[HEADER.size:]
    if kind in (DENSE32, DENSE16):
        width = 4 if kind == DENSE32 else 2
        if count != dim:
            raise GeoPayloadError(f"dense payload of {count} values for dimension {dim}")
        if len(body) != count * width:
            raise GeoPayloadError(f"dense body of {len(body)} bytes, the header says {count * width}")
        values = np.frombuffer(body, "<f4" if width == 4 else "<f2").astype(np.float32)
        indices = None
    elif kind == SPARSE:
        if count > dim:
            raise GeoPayloadError(f"{count} sparse entries for dimension {dim}")
        if len(body) != count * 8:
            raise GeoPayloadError(f"sparse body of {len(body)} bytes, the header says {count} entries "
                                  f"({count * 8} bytes)")
        indices = np.frombuffer(body[:count * 4], "<u4").astype(np.int64)
        values = np.frombuffer(body[count * 4:], "<f4").astype(np.float32)
        if count and int(indices.max()) >= dim:
            raise GeoPayloadError(f"sparse index {int(indices.max())} out of range for dimension {dim}")
        if count > 1 and not np.all(np.diff(indices) > 0):
            raise GeoPayloadError("sparse indices repeated or out of order")
    elif kind == BEAT:
        if count or len(body):
            raise GeoPayloadError(f"a heartbeat with {count} entries and {len(body)} body bytes")
        values, indices = np.zeros(0, np.float32), None
    else:
        raise GeoPayloadError(f"unknown payload kind {kind}")
    if not np.all(np.isfinite(values)):
        raise GeoPayloadError("values not finite")
    return Payload(kind, round_, dim, values, indices)


def sum_sparse(payloads: list[Payload], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum sparse payloads by index, in the order given: (ascending union of indices, sums)."""
    acc = np.zeros(dim, np.float32)
    union = np.zeros(0, np.int64)
    for p in payloads:
        np.add.at(acc, p.indices, p.values)
        union = np.union1d(union, p.indices)
    return union, acc[union]
