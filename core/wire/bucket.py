"""The DGC gradient bucket: one rank's payloads for one step, as bytes.

A data-parallel worker sends one bucket per step carrying every tensor of the
model, each either dense (all values) or sparse (DGC's selected entries).
Little-endian, in the style of ``core/codecs.py``: a 20-byte header, then per
tensor a 12-byte entry header and its body.

    header   magic 4s = b"DGC\\0", version u8 = 1, value dtype u8 (fp32=0,
             fp16=1), tensors u16, rank u32, step u32, world size u32
    entry    index u16 (= its position), kind u8 (dense=0, sparse=1),
             reserved u8 = 0, numel u32, k u32 (= numel when dense)
    body     dense:  numel values                  numel · vb bytes
             sparse: k int32 indices (ascending), k values   k · (4 + vb)

vb is 4 for fp32 values and 2 for fp16, so a sparse entry costs 8 or 6 bytes.
The decoder knows the model's shapes and checks every entry header against
them and the sum of all declared bodies against the buffer's length before it
reads (or allocates for) any body, so a forged k cannot make it allocate more
than the bytes it was given.  Anything malformed raises ``FrameError``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from dtemu.core.compression.codecs import byte_view
from dtemu.core.errors import FrameError

VERSION = 1
MAGIC = b"DGC\x00"
HEADER = struct.Struct("<4sBBHIII")
HEADER_SIZE = HEADER.size  # 20
ENTRY = struct.Struct("<HBBII")
ENTRY_SIZE = ENTRY.size  # 12

DENSE, SPARSE = 0, 1
FP32, FP16 = 0, 1
_VALUE_BYTES = {FP32: 4, FP16: 2}
_WIRE_VALUE = {FP32: np.dtype("<f4"), FP16: np.dtype("<f2")}
_WIRE_INDEX = np.dtype("<i4")

MAX_TENSORS = (1 << 16) - 1
_U32_MAX = (1 << 32) - 1
# Indices are int32 on the wire, so a sparse tensor cannot be longer.
_SPARSE_MAX_NUMEL = (1 << 31) - 1

Shapes = Sequence[tuple[str, tuple[int, ...]]]


@dataclass
class TensorPayload:
    """One tensor's share of a bucket, flat.

    Dense when ``indices`` is None (``values`` has ``numel`` entries), sparse
    otherwise (``values[j]`` belongs at flat position ``indices[j]``).
    """

    numel: int
    values: torch.Tensor  # float32
    indices: torch.Tensor | None = None  # int64, strictly increasing

    @property
    def kind(self) -> int:
        return DENSE if self.indices is None else SPARSE

    @property
    def k(self) -> int:
        """Entries carried: numel for a dense payload."""
        return int(self.values.numel())

    def to_dense(self) -> torch.Tensor:
        if self.indices is None:
            return self.values.clone()
        out = torch.zeros(self.numel, dtype=torch.float32)
        out[self.indices] = self.values
        return out


@dataclass
class Bucket:
    """What one rank sends at one step: a payload per model tensor, in order."""

    rank: int
    step: int
    world_size: int
    fp16_values: bool
    payloads: list[TensorPayload]

    def is_finite(self) -> bool:
        return all(bool(torch.isfinite(p.values).all()) for p in self.payloads)


def numels(shapes: Shapes) -> list[int]:
    return [math.prod(shape) for _, shape in shapes]


def _entry_body_size(kind: int, numel: int, k: int, value_bytes: int) -> int:
    return numel * value_bytes if kind == DENSE else k * (4 + value_bytes)


def bucket_size(bucket: Bucket) -> int:
    """Exact number of bytes ``encode_bucket(bucket)`` produces."""
    vb = _VALUE_BYTES[FP16 if bucket.fp16_values else FP32]
    return HEADER_SIZE + sum(
        ENTRY_SIZE + _entry_body_size(p.kind, p.numel, p.k, vb) for p in bucket.payloads
    )


# ---------------------------------------------------------------- encode


def _check_encodable(bucket: Bucket) -> None:
    """A bucket the header cannot express is a caller's bug: ValueError."""
    if not 0 <= bucket.rank < bucket.world_size <= _U32_MAX:
        raise ValueError(f"need 0 <= rank < world_size < 2^32, got {bucket.rank}, {bucket.world_size}")
    if not 0 <= bucket.step <= _U32_MAX:
        raise ValueError(f"step {bucket.step} does not fit in u32")
    if len(bucket.payloads) > MAX_TENSORS:
        raise ValueError(f"{len(bucket.payloads)} tensors exceed the limit of {MAX_TENSORS}")
    for i, p in enumerate(bucket.payloads):
        if p.values.dim() != 1:
            raise ValueError(f"tensor {i}: values must be flat, got shape {tuple(p.values.shape)}")
        if p.indices is None:
            if p.k != p.numel or p.numel > _U32_MAX:
                raise ValueError(f"tensor {i}: dense payload of {p.k} values for numel {p.numel}")
        elif p.indices.shape != p.values.shape or p.numel > _SPARSE_MAX_NUMEL or p.k > p.numel:
            raise ValueError(f"tensor {i}: {tuple(p.indices.shape)} indices for "
                             f"{tuple(p.values.shape)} values of numel {p.numel}")


def encode_bucket(bucket: Bucket) -> bytes:
    _check_encodable(bucket)
    vdtype = FP16 if bucket.fp16_values else FP32
    wire_value = _WIRE_VALUE[vdtype]
    parts = [HEADER.pack(MAGIC, VERSION, vdtype, len(bucket.payloads),
                         bucket.rank, bucket.step, bucket.world_size)]
    for i, p in enumerate(bucket.payloads):
        parts.append(ENTRY.pack(i, p.kind, 0, p.numel, p.k))
        if p.indices is not None:
            parts.append(p.indices.numpy().astype(_WIRE_INDEX).tobytes())
        parts.append(p.values.detach().numpy().astype(wire_value).tobytes())
    return b"".join(parts)


# ---------------------------------------------------------------- decode


def _check_header(view: memoryview, n_tensors: int, world_size: int | None):
    if len(view) < HEADER_SIZE:
        raise FrameError(f"bucket of {len(view)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, vdtype, count, rank, step, ws = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise FrameError(f"bad bucket magic {magic!r}")
    if version != VERSION:
        raise FrameError(f"unknown bucket version {version} (expected {VERSION})")
    if vdtype not in _VALUE_BYTES:
        raise FrameError(f"unknown value dtype {vdtype}")
    if count != n_tensors:
        raise FrameError(f"bucket carries {count} tensors but the model has {n_tensors}")
    if ws == 0 or rank >= ws:
        raise FrameError(f"rank {rank} is outside world size {ws}")
    if world_size is not None and ws != world_size:
        raise FrameError(f"bucket says world size {ws}, expected {world_size}")
    return vdtype, rank, step, ws


def _walk_entries(view: memoryview, expected_numels: list[int], value_bytes: int):
    """Check every entry header and body size; return (kind, numel, k, body offset)."""
    entries = []
    off = HEADER_SIZE
    for i, want_numel in enumerate(expected_numels):
        if len(view) - off < ENTRY_SIZE:
            raise FrameError(f"bucket truncated in the header of tensor {i}")
        index, kind, reserved, numel, k = ENTRY.unpack_from(view, off)
        off += ENTRY_SIZE
        if index != i:
            raise FrameError(f"entry {i} names tensor {index}")
        if kind not in (DENSE, SPARSE):
            raise FrameError(f"tensor {i}: unknown kind {kind}")
        if reserved != 0:
            raise FrameError(f"tensor {i}: reserved byte is {reserved}, must be 0")
        if numel != want_numel:
            raise FrameError(f"tensor {i}: numel {numel} but the model's tensor has {want_numel}")
        if kind == DENSE and k != numel:
            raise FrameError(f"tensor {i}: dense entry needs k == numel, got k={k}, numel={numel}")
        if kind == SPARSE and (k > numel or numel > _SPARSE_MAX_NUMEL):
            raise FrameError(f"tensor {i}: sparse entry of k={k} for numel {numel}")
        body = _entry_body_size(kind, numel, k, value_bytes)
        if len(view) - off < body:
            raise FrameError(f"tensor {i}: body of {body} bytes but only {len(view) - off} left")
        entries.append((kind, numel, k, off))
        off += body
    if off != len(view):
        raise FrameError(f"{len(view) - off} trailing bytes after the last tensor")
    return entries


def _read_indices(view: memoryview, offset: int, k: int, numel: int, i: int) -> torch.Tensor:
    # Widen first: an int32 diff can wrap and make a descending pair look ascending.
    idx = np.frombuffer(view, dtype=_WIRE_INDEX, count=k, offset=offset).astype(np.int64)
    if k:
        if idx[0] < 0 or idx[-1] >= numel:
            raise FrameError(f"tensor {i}: index out of range [0, {numel})")
        if k > 1 and not (np.diff(idx) > 0).all():
            raise FrameError(f"tensor {i}: indices are not strictly increasing")
    return torch.from_numpy(idx)


def decode_bucket(data, shapes: Shapes, *, world_size: int | None = None) -> Bucket:
    """Decode a bucket for a model of ``shapes``; FrameError for anything malformed.

    Values come back as owned float32 tensors (fp16 widened exactly), indices
    as int64.  Non-finite values are not a framing error: ``Bucket.is_finite``
    reports them and the aggregation refuses them.
    """
    view = byte_view(data, FrameError, "bucket")
    expected = numels(shapes)
    vdtype, rank, step, ws = _check_header(view, len(expected), world_size)
    wire_value = _WIRE_VALUE[vdtype]
    payloads = []
    for i, (kind, numel, k, off) in enumerate(_walk_entries(view, expected, _VALUE_BYTES[vdtype])):
        indices = None
        if kind == SPARSE:
            indices = _read_indices(view, off, k, numel, i)
            off += 4 * k
        values = np.frombuffer(view, dtype=wire_value, count=k, offset=off).astype(np.float32)
        payloads.append(TensorPayload(numel, torch.from_numpy(values), indices))
    return Bucket(rank, step, ws, vdtype == FP16, payloads)
