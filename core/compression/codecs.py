"""Update codecs: how a flat float32 vector of length D travels as bytes.

Four codecs share one 20-byte little-endian header, so a receiver knows a
packet by its prefix and can check every declared size before it reads (or
allocates for) the body:

    magic    4s   the codec's own prefix (b"FP32", b"Q8\\0\\0", b"S4\\0\\0", b"SQ8\\0")
    version  u8   = 1
    codec    u8   fp32=0, q8=1, s4=2, sq8=3 (must agree with the magic)
    reserved u16  = 0
    D        u32  length of the vector
    k        u32  entries carried (D for the dense codecs)
    chunk    u32  quantisation chunk C for q8 / sq8, 0 otherwise

Bodies:
    fp32  D float32                                   4·D bytes
    q8    ceil(D/C) float32 scales, D int8            4·ceil(D/C) + D
    s4    k int32 indices (ascending), k float32      8·k
    sq8   k int32 indices, ceil(k/C) float32 scales, k int8
                                                      4·k + 4·ceil(k/C) + k

Quantisation (per chunk, symmetric int8) and top-k are core.compression.kernels.
"""

from __future__ import annotations

import numbers
import struct
from dataclasses import dataclass

import numpy as np

from dtemu.core.compression.kernels import ceil_div, dequantise, quantise, topk, topk_count  # noqa: F401 (topk_count: its old home)
from dtemu.core.errors import CodecError

CODECS = ("fp32", "q8", "s4", "sq8")

VERSION = 1
HEADER = struct.Struct("<4sBBHIII")
HEADER_SIZE = HEADER.size  # 20

_MAGIC = {"fp32": b"FP32", "q8": b"Q8\x00\x00", "s4": b"S4\x00\x00", "sq8": b"SQ8\x00"}
_CODEC_ID = {name: i for i, name in enumerate(CODECS)}
_NAME_BY_MAGIC = {magic: name for name, magic in _MAGIC.items()}

_DENSE = frozenset({"fp32", "q8"})
_CHUNKED = frozenset({"q8", "sq8"})
_SPARSE = frozenset({"s4", "sq8"})

_U32_MAX = (1 << 32) - 1
# Sparse indices are int32 on the wire, so a sparse vector cannot be longer.
_SPARSE_MAX_DIM = 1 << 31

# Explicit little-endian wire dtypes, so a big-endian host still reads them right.
_F32 = np.dtype("<f4")
_I32 = np.dtype("<i4")
_I8 = np.dtype("i1")


@dataclass(frozen=True)
class CodecParams:
    """Which codec, and its knobs (ignored by codecs that do not use them)."""

    name: str = "fp32"
    chunk: int = 8192
    density: float = 0.1

    def __post_init__(self):
        if self.name not in CODECS:
            raise ValueError(f"unknown codec {self.name!r}; expected one of {CODECS}")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int):
            raise ValueError(f"chunk must be an int, got {self.chunk!r}")
        if not 1 <= self.chunk <= _U32_MAX:
            raise ValueError(f"chunk must be in [1, 2^32-1], got {self.chunk}")
        if not (isinstance(self.density, numbers.Real) and 0.0 < self.density <= 1.0):
            raise ValueError(f"density must be in (0, 1], got {self.density!r}")


# ---------------------------------------------------------------- decoded forms


@dataclass
class Dense:
    """A decoded dense vector (fp32, q8)."""

    values: np.ndarray  # float32, length D

    @property
    def dim(self) -> int:
        return int(self.values.shape[0])

    def to_dense(self) -> np.ndarray:
        return self.values

    def is_finite(self) -> bool:
        return bool(np.isfinite(self.values).all())


@dataclass
class Sparse:
    """A decoded sparse vector (s4, sq8): values at ``indices``, zero elsewhere."""

    dim: int
    indices: np.ndarray  # int64, strictly increasing when it came from decode()
    values: np.ndarray  # float32, same length as indices

    def to_dense(self) -> np.ndarray:
        out = np.zeros(self.dim, dtype=np.float32)
        out[self.indices] = self.values
        return out

    def is_finite(self) -> bool:
        return bool(np.isfinite(self.values).all())


# ---------------------------------------------------------------- sizes


def _body_size(name: str, dim: int, k: int, chunk: int) -> int:
    if name == "fp32":
        return 4 * dim
    if name == "q8":
        return 4 * ceil_div(dim, chunk) + dim
    if name == "s4":
        return 8 * k
    return 4 * k + 4 * ceil_div(k, chunk) + k  # sq8


def packet_size(dim: int, params: CodecParams) -> int:
    """Exact number of bytes encode() produces for a vector of length ``dim``."""
    if dim < 0:
        raise ValueError(f"dim must be >= 0, got {dim}")
    k = topk_count(dim, params.density) if params.name in _SPARSE else dim
    return HEADER_SIZE + _body_size(params.name, dim, k, params.chunk)


# ---------------------------------------------------------------- encode


def encode(vec: np.ndarray, params: CodecParams) -> bytes:
    """Encode a flat vector (cast to float32) with ``params``.

    Lossy codecs refuse non-finite input (ValueError): a NaN scale could not be
    decoded, and a NaN magnitude has no place in a top-k order.  fp32 carries
    NaN / Inf through so the receiver can reject the update for what it is.
    """
    x = np.ascontiguousarray(vec, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"expected a flat vector, got shape {x.shape}")
    dim = x.shape[0]
    name = params.name
    limit = _SPARSE_MAX_DIM if name in _SPARSE else _U32_MAX
    if dim > limit:
        raise ValueError(f"vector of length {dim} is too long for codec {name}")
    if name != "fp32" and not np.isfinite(x).all():
        raise ValueError(f"codec {name} cannot encode a vector with NaN or Inf")

    chunk = params.chunk if name in _CHUNKED else 0
    k = topk_count(dim, params.density) if name in _SPARSE else dim
    header = HEADER.pack(_MAGIC[name], VERSION, _CODEC_ID[name], 0, dim, k, chunk)

    if name == "fp32":
        parts = [x.astype(_F32, copy=False)]
    elif name == "q8":
        parts = list(quantise(x, chunk))
    else:
        idx = topk(x, k)
        values = x[idx]
        if name == "s4":
            parts = [idx.astype(_I32), values]
        else:
            parts = [idx.astype(_I32), *quantise(values, chunk)]
    return header + b"".join(p.astype(p.dtype.newbyteorder("<"), copy=False).tobytes() for p in parts)


# ---------------------------------------------------------------- decode


def byte_view(data, error: type[Exception] = CodecError, what: str = "packet") -> memoryview:
    """A flat byte view of any contiguous buffer; ``error`` if there is none."""
    try:
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
    except TypeError as e:
        raise error(f"{what} is not a contiguous byte buffer: {e}") from None
    return view


def peek_codec(data) -> str:
    """The codec a packet claims by its magic; CodecError if it claims none."""
    view = byte_view(data)
    if len(view) < 4:
        raise CodecError(f"packet of {len(view)} bytes is too short for a codec magic")
    magic = bytes(view[:4])
    try:
        return _NAME_BY_MAGIC[magic]
    except KeyError:
        raise CodecError(f"unknown codec magic {magic!r}") from None


def _check_header(view: memoryview, expected_dim: int | None, max_dim: int):
    """Validate the header against itself and the packet length; return its fields."""
    if len(view) < HEADER_SIZE:
        raise CodecError(f"packet of {len(view)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, codec_id, reserved, dim, k, chunk = HEADER.unpack_from(view, 0)
    name = _NAME_BY_MAGIC.get(magic)
    if name is None:
        raise CodecError(f"unknown codec magic {magic!r}")
    if codec_id != _CODEC_ID[name]:
        raise CodecError(f"magic says {name} but codec id is {codec_id}")
    if version != VERSION:
        raise CodecError(f"unknown codec version {version} (expected {VERSION})")
    if reserved != 0:
        raise CodecError(f"reserved header field is {reserved}, must be 0")
    if dim > max_dim:
        raise CodecError(f"declared D={dim} exceeds max_dim={max_dim}")
    if expected_dim is not None and dim != expected_dim:
        raise CodecError(f"declared D={dim} but expected {expected_dim}")
    if name in _DENSE:
        if k != dim:
            raise CodecError(f"dense codec {name} needs k == D, got k={k}, D={dim}")
    else:
        if k > dim:
            raise CodecError(f"sparse codec {name} carries k={k} entries of only D={dim}")
        if dim > _SPARSE_MAX_DIM:
            raise CodecError(f"D={dim} cannot be addressed by int32 indices")
    if name in _CHUNKED:
        if chunk == 0:
            raise CodecError(f"codec {name} needs a nonzero chunk size")
    elif chunk != 0:
        raise CodecError(f"codec {name} has no chunks but chunk={chunk}")
    body = len(view) - HEADER_SIZE
    want = _body_size(name, dim, k, chunk)
    if body != want:
        raise CodecError(f"{name} body is {body} bytes but the header implies {want}")
    return name, dim, k, chunk


def _read_scales(view: memoryview, offset: int, count: int) -> np.ndarray:
    scales = np.frombuffer(view, dtype=_F32, count=count, offset=offset)
    if not np.isfinite(scales).all():
        raise CodecError("non-finite quantisation scale")
    if (scales < 0).any():
        raise CodecError("negative quantisation scale")
    return scales.astype(np.float32, copy=False)


def _read_codes(view: memoryview, offset: int, count: int) -> np.ndarray:
    q = np.frombuffer(view, dtype=_I8, count=count, offset=offset)
    # The encoder clips to ±127; -128 only appears in a forged or damaged packet.
    if count and q.min() < -127:
        raise CodecError("int8 code -128 is outside the symmetric range")
    return q


def _read_indices(view: memoryview, offset: int, k: int, dim: int) -> np.ndarray:
    # Widen first: an int32 diff can wrap and make a descending pair look ascending.
    idx = np.frombuffer(view, dtype=_I32, count=k, offset=offset).astype(np.int64)
    if k:
        if idx[0] < 0 or idx[-1] >= dim:
            raise CodecError(f"index out of range [0, {dim})")
        if k > 1 and not (np.diff(idx) > 0).all():
            raise CodecError("indices are not strictly increasing")
    return idx


def decode(
    data: bytes | memoryview,
    *,
    expected_dim: int | None = None,
    max_dim: int = 1 << 28,
) -> Dense | Sparse:
    """Decode a packet; CodecError for anything malformed.

    Every declared size is checked against the header and the packet length
    before the body is read, so a forged header cannot trigger a large
    allocation.  Returned arrays are owned, writable float32 / int64.
    """
    view = byte_view(data)
    name, dim, k, chunk = _check_header(view, expected_dim, max_dim)
    off = HEADER_SIZE

    if name == "fp32":
        values = np.frombuffer(view, dtype=_F32, count=dim, offset=off)
        return Dense(values.astype(np.float32, copy=True))
    if name == "q8":
        nscales = ceil_div(dim, chunk)
        scales = _read_scales(view, off, nscales)
        q = _read_codes(view, off + 4 * nscales, dim)
        return Dense(dequantise(q, scales, chunk))

    idx = _read_indices(view, off, k, dim)
    off += 4 * k
    if name == "s4":
        values = np.frombuffer(view, dtype=_F32, count=k, offset=off).astype(np.float32, copy=True)
    else:
        nscales = ceil_div(k, chunk)
        scales = _read_scales(view, off, nscales)
        q = _read_codes(view, off + 4 * nscales, k)
        values = dequantise(q, scales, chunk)
    return Sparse(dim=dim, indices=idx, values=values)


# ---------------------------------------------------------------- error feedback


class ErrorFeedback:
    """Client-side residual for lossy codecs.

    What the codec dropped this round is added to next round's vector, so over
    many rounds the sum of what was sent tracks the sum of what was meant.
    """

    def __init__(self, params: CodecParams):
        self.params = params
        self.residual: np.ndarray | None = None

    def encode(self, vec) -> bytes:
        x = np.asarray(vec, dtype=np.float32)
        if self.residual is not None:
            if x.shape != self.residual.shape:
                raise ValueError(f"vector shape {x.shape} differs from residual {self.residual.shape}")
            x = x + self.residual
        packet = encode(x, self.params)
        sent = decode(packet, expected_dim=x.shape[0], max_dim=max(x.shape[0], 1 << 28))
        self.residual = x - sent.to_dense()
        return packet
