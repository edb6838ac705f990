"""The bytes of geo traffic: a gradient (or weights), dense or sparse, of one round.

    envelope (core.wire.envelope: type = the kind, aux = its flag) | round u32 | dim u32 | count u32 | body

- DENSE32 / DENSE16: ``count == dim`` values, float32 or float16 (FP16: every
  dense transfer in half precision);
- BEAT: a heartbeat (``count`` 0, no body): the sender is alive (``geo.heartbeat_s``);
- JOIN: a local PS that has just started says so (``count`` 0, no body): the global
  PS counts it from the start, or, once the run is going, lets it join;
- END: MixedSync's global PS tells the master the run is over (``count`` 0, no body):
  ``round`` is the last update it sent it, when that is fewer than the run's nominal
  count (a site lost, or one that joined late and ran fewer rounds);
- STATE: the global model for a site that joins a running run: ``count == dim``,
  the flag byte says how many float32 vectors follow (1: weights; 2: weights and
  the workers' SGD momentum buffer), ``round`` the round they are the model of;
- SPARSE: ``count`` (index, value) pairs, indices u32 strictly ascending
  (so never repeated) and below ``dim``, then ``count`` float32 values (the
  sparse traffic between parameter servers stays fp32);
- BLOCKS: BiSparse with tensors sent whole (``geo.dense_below``): the flag byte
  says the blocks' width (0: float32, 1: float16, as every dense transfer under
  FP16), then ``nblocks`` u32 and ``total`` u32, ``nblocks`` (start u32, length
  u32) ranges, ascending and disjoint, ``total`` dense values (the sum of the
  lengths), then ``count`` (index, value) pairs as SPARSE, none inside a block.
  A whole tensor costs 2 (fp16) or 4 bytes an entry instead of a pair's 8.

Every byte off the wire is untrusted: ``decode`` checks the envelope, that the
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
from dtemu.core.wire import envelope
from dtemu.core.wire.half import from_half, to_half

HEAD = struct.Struct("<III")   # after the envelope: round, dim, count
HEADER_SIZE = envelope.SIZE + HEAD.size
BLOCKS_HEADER = struct.Struct("<II")   # nblocks, total dense values
DENSE32, DENSE16, SPARSE, BEAT, BLOCKS, JOIN, STATE, END = (envelope.FAMILIES["geo"][k] for k in (
    "dense32", "dense16", "sparse", "beat", "blocks", "join", "state", "end"))
KIND_NAMES = {DENSE32: "dense32", DENSE16: "dense16", SPARSE: "sparse", BEAT: "beat", BLOCKS: "blocks",
              JOIN: "join", STATE: "state", END: "end"}


@dataclass(frozen=True)
class Payload:
    kind: int
    round: int
    dim: int
    values: np.ndarray            # float32: dense, dim values; sparse, count values
    indices: np.ndarray | None    # sparse and blocks: int64 positions, ascending
    momentum: np.ndarray | None = None   # STATE with a momentum buffer

    @property
    def sparse(self) -> bool:
        """Entries by position (SPARSE, or BLOCKS: its blocks' positions and its pairs, merged)."""
        return self.kind in (SPARSE, BLOCKS)

    def dense(self) -> np.ndarray:
        """The dim-long float32 vector (zeros where a sparse payload sends nothing)."""
        if not self.sparse:
            return self.values
        out = np.zeros(self.dim, np.float32)
        out[self.indices] = self.values
        return out


def head(kind: int, flag: int, round_: int, dim: int, count: int) -> bytes:
    """A payload's first 20 bytes: the envelope, then round, dim and count."""
    return envelope.pack(kind, flag) + HEAD.pack(round_, dim, count)


def encode_dense(round_: int, vec: np.ndarray, fp16: bool = False) -> bytes:
    vec = to_half(vec) if fp16 else np.ascontiguousarray(vec, dtype=np.float32)
    return head(DENSE16 if fp16 else DENSE32, 0, round_, vec.size, vec.size) + vec.tobytes()


def encode_sparse(round_: int, dim: int, indices: np.ndarray, values: np.ndarray) -> bytes:
    idx = np.ascontiguousarray(indices, dtype="<u4")
    vals = np.ascontiguousarray(values, dtype="<f4")
    if idx.shape != vals.shape or idx.ndim != 1:
        raise ValueError("indices and values must be two 1-D arrays of one length")
    return head(SPARSE, 0, round_, dim, idx.size) + idx.tobytes() + vals.tobytes()


def encode_blocks(round_: int, dim: int, blocks: list[tuple[int, int]], indices: np.ndarray,
                  values: np.ndarray, fp16: bool = False) -> bytes:
    """(index, value) entries with the ``blocks`` ((start, length), ascending, disjoint) sent as dense
    runs (float16 under FP16): an entry inside a block goes in its run (a position of a block that
    ``indices`` lacks is sent as 0), the others as pairs."""
    idx = np.asarray(indices, dtype=np.int64)
    vals = np.asarray(values, dtype=np.float32)
    if idx.shape != vals.shape or idx.ndim != 1:
        raise ValueError("indices and values must be two 1-D arrays of one length")
    inside = np.zeros(dim, dtype=bool)
    for start, length in blocks:
        inside[start:start + length] = True
    full = np.zeros(dim, np.float32)
    full[idx] = vals
    dense = np.concatenate([full[s:s + n] for s, n in blocks]) if blocks else np.zeros(0, np.float32)
    pairs = ~inside[idx]
    table = np.asarray(blocks, dtype="<u4").reshape(-1)
    first = head(BLOCKS, 1 if fp16 else 0, round_, dim, int(pairs.sum()))
    return (first + BLOCKS_HEADER.pack(len(blocks), dense.size) + table.tobytes()
            + (to_half(dense) if fp16 else dense.astype("<f4")).tobytes()
            + idx[pairs].astype("<u4").tobytes() + vals[pairs].astype("<f4").tobytes())


def encode_beat(dim: int) -> bytes:
    return head(BEAT, 0, 0, dim, 0)


def encode_join(dim: int) -> bytes:
    return head(JOIN, 0, 0, dim, 0)


def encode_end(dim: int, last: int) -> bytes:
    return head(END, 0, last, dim, 0)


def encode_state(round_: int, weights: np.ndarray, momentum: np.ndarray | None = None) -> bytes:
    vecs = [weights] if momentum is None else [weights, momentum]
    body = b"".join(np.ascontiguousarray(v, dtype="<f4").tobytes() for v in vecs)
    return head(STATE, len(vecs), round_, weights.size, weights.size) + body


def decode(data: bytes, dim: int) -> Payload:
    """The payload in ``data``, for a receiver whose vectors have ``dim`` entries."""
    kind, flag, body = envelope.unpack(data, "geo", lambda _, text: GeoPayloadError(text))
    if len(data) < HEADER_SIZE:
        raise GeoPayloadError(f"{len(data)} bytes: shorter than the {HEADER_SIZE}-byte header")
    round_, pdim, count = HEAD.unpack_from(body)
    if pdim != dim:
        raise GeoPayloadError(f"dimension {pdim}, expected {dim}")
    body = body[HEAD.size:]
    if kind in (DENSE32, DENSE16):
        width = 4 if kind == DENSE32 else 2
        if count != dim:
            raise GeoPayloadError(f"dense payload of {count} values for dimension {dim}")
        if len(body) != count * width:
            raise GeoPayloadError(f"dense body of {len(body)} bytes, the header says {count * width}")
        values = np.frombuffer(body, "<f4").astype(np.float32) if width == 4 else from_half(body)
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
    elif kind == BLOCKS:
        indices, values = _decode_blocks(body, dim, flag, count)
    elif kind in (BEAT, JOIN, END):
        if count or len(body):
            raise GeoPayloadError(f"a {KIND_NAMES[kind] if kind != BEAT else 'heartbeat'} with {count} entries "
                                  f"and {len(body)} body bytes")
        values, indices = np.zeros(0, np.float32), None
    elif kind == STATE:
        if flag not in (1, 2) or count != dim:
            raise GeoPayloadError(f"a state of {flag} vectors of {count} values for dimension {dim}")
        if len(body) != 4 * flag * dim:
            raise GeoPayloadError(f"state body of {len(body)} bytes, the header says {4 * flag * dim}")
        vecs = np.frombuffer(body, "<f4").astype(np.float32).reshape(flag, dim)
        if not np.all(np.isfinite(vecs)):
            raise GeoPayloadError("values not finite")
        return Payload(kind, round_, dim, vecs[0], None, vecs[1] if flag == 2 else None)
    else:
        raise GeoPayloadError(f"unknown payload kind {kind}")
    if not np.all(np.isfinite(values)):
        raise GeoPayloadError("values not finite")
    return Payload(kind, round_, dim, values, indices)


def _decode_blocks(body: memoryview, dim: int, flag: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """A BLOCKS body's (ascending positions, float32 values), every count and range checked first."""
    if flag not in (0, 1):
        raise GeoPayloadError(f"blocks of unknown width flag {flag}")
    width = 2 if flag else 4
    if len(body) < BLOCKS_HEADER.size:
        raise GeoPayloadError(f"blocks body of {len(body)} bytes: no block count")
    nblocks, total = BLOCKS_HEADER.unpack_from(body)
    if total + count > dim:
        raise GeoPayloadError(f"{total} block values and {count} sparse entries for dimension {dim}")
    expect = BLOCKS_HEADER.size + 8 * nblocks + width * total + 8 * count
    if len(body) != expect:
        raise GeoPayloadError(f"blocks body of {len(body)} bytes, the header says {expect} "
                              f"({nblocks} blocks, {total} values, {count} entries)")
    off = BLOCKS_HEADER.size
    table = np.frombuffer(body[off:off + 8 * nblocks], "<u4").astype(np.int64).reshape(-1, 2)
    starts, lengths = table[:, 0], table[:, 1]
    if nblocks and (lengths.min() == 0 or int((starts + lengths).max()) > dim):
        raise GeoPayloadError(f"a block empty or past dimension {dim}")
    if nblocks > 1 and np.any(starts[1:] < starts[:-1] + lengths[:-1]):
        raise GeoPayloadError("blocks overlapping or out of order")
    if int(lengths.sum()) != total:
        raise GeoPayloadError(f"blocks of {int(lengths.sum())} entries, the header says {total}")
    off += 8 * nblocks
    chunk = body[off:off + width * total]
    dense = from_half(chunk) if flag else np.frombuffer(chunk, "<f4").astype(np.float32)
    off += width * total
    idx = np.frombuffer(body[off:off + 4 * count], "<u4").astype(np.int64)
    vals = np.frombuffer(body[off + 4 * count:], "<f4").astype(np.float32)
    if count and int(idx.max()) >= dim:
        raise GeoPayloadError(f"sparse index {int(idx.max())} out of range for dimension {dim}")
    if count > 1 and not np.all(np.diff(idx) > 0):
        raise GeoPayloadError("sparse indices repeated or out of order")
    # an entry sent twice (a pair inside a block) would be applied twice: refuse it
    slot = np.searchsorted(starts, idx, side="right") - 1
    if count and nblocks and np.any((slot >= 0) & (idx < starts[slot] + lengths[slot])):
        raise GeoPayloadError("a sparse index inside a dense block")
    positions = (np.concatenate([np.arange(s, s + n) for s, n in table]) if nblocks
                 else np.zeros(0, np.int64))
    positions = np.concatenate([positions, idx])
    order = np.argsort(positions, kind="stable")
    return positions[order], np.concatenate([dense, vals])[order]


def sum_sparse(payloads: list[Payload], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum sparse payloads by index, in the order given: (ascending union of indices, sums)."""
    acc = np.zeros(dim, np.float32)
    union = np.zeros(0, np.int64)
    for p in payloads:
        np.add.at(acc, p.indices, p.values)
        union = np.union1d(union, p.indices)
    return union, acc[union]
