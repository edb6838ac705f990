"""A collective's frames: their format, checked as untrusted bytes, and their reassembly.

Every payload travels as frames on one topic (``coll/frames``). A frame header
says which collective it belongs to and where its bytes go::

    envelope (core.wire.envelope: type FRAME, aux = group) | round u32 |
    rank u16 | world u16 | part u32 | seq u32 | seq_count u32 | total u64 |
    name length u8 | name | frame bytes

(``round`` is the step, ``name`` what is exchanged, ``part`` a chunk id for
multi-step algorithms, ``seq / seq_count`` the frame's place in the payload,
``total`` the payload's length.) Frames may arrive in any order and interleaved
with other rounds and names; an ``Assembly`` per (round, name, part, rank)
puts them back together (core.ddp.collectives keeps them).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from dtemu.core.errors import FrameError
from dtemu.core.runtime.requests import Buffers
from dtemu.core.wire import envelope

FRAME = envelope.FAMILIES["ddp"]["frame"]
# Payload bytes per frame: a frame and its header fit in one 1 MiB transport
# sample (DDS samples of ~1 MiB gave the best throughput).
FRAME_BYTES = (1 << 20) - 1024
# Pieces of the pipelined allreduce (core.ddp.pipelined), one frame each.  Whole frames:
# in real mode a frame costs ~0.17 ms of CPU besides its bytes (~0.3 ms per MB), so
# 256 KiB pieces spent more on frames than they won by overlapping (docs/notebook/).
PIECE_BYTES = FRAME_BYTES
# Frames with bodies from this size on are sent as their pieces (encode_frame): the join is a copy
# of the body that real mode's shared-memory path would make twice.
PIECES_FROM = 64 << 10
_FIELDS = struct.Struct("<IHHIIIQB")   # after the envelope: round ... name length
HEADER_SIZE = envelope.SIZE + _FIELDS.size
MAX_NAME = 32



@dataclass(frozen=True)
class Frame:
    group: int
    round: int
    name: str
    part: int
    rank: int
    world: int
    seq: int
    seq_count: int
    total: int
    data: bytes | memoryview


def encode_frame(f: Frame, pieces: bool = False) -> bytes | Buffers:
    """The frame's bytes; with ``pieces`` as its header and its body (``Buffers``), which the
    runtime copies once where it copies anyway instead of joining them here (a frame of a
    large payload)."""
    name = f.name.encode()
    header = envelope.pack(FRAME, f.group) + _FIELDS.pack(f.round, f.rank, f.world, f.part, f.seq, f.seq_count,
                                                          f.total, len(name))
    if pieces:
        return Buffers(header + name, f.data)
    return b"".join((header, name, f.data))


def decode_frame(data: bytes, *, world: int, max_total: int) -> Frame:
    """Bytes -> Frame, checked against the group's world size and a payload bound."""
    _, group, fields = envelope.unpack(data, "ddp", lambda _, text: FrameError(text))
    if len(data) < HEADER_SIZE:
        raise FrameError(f"frame of {len(data)} bytes is shorter than its header")
    round_, rank, world_, part, seq, count, total, n = _FIELDS.unpack_from(fields)
    if world_ != world or rank >= world:
        raise FrameError(f"frame from rank {rank} of world {world_}, expected world {world}")
    if total > max_total:
        raise FrameError(f"frame claims a payload of {total} bytes, more than the {max_total} allowed")
    if count == 0 or seq >= count or count > max(1, total):
        raise FrameError(f"frame {seq} of {count} is out of range for {total} bytes")
    if not 0 < n <= MAX_NAME or len(data) < HEADER_SIZE + n:
        raise FrameError("frame name is missing or too long")
    try:
        name = bytes(data[HEADER_SIZE : HEADER_SIZE + n]).decode()
    except UnicodeDecodeError:
        raise FrameError("frame name is not UTF-8") from None
    body = memoryview(data)[HEADER_SIZE + n :]  # no copy: the assembly joins the bodies once
    return Frame(group, round_, name, part, rank, world_, seq, count, total, body)


def split_payload(payload: bytes, frame_bytes: int) -> list[bytes]:
    if not payload:
        return [b""]
    view = memoryview(payload)  # slices without copies; encode_frame copies each once
    return [view[i : i + frame_bytes] for i in range(0, len(payload), frame_bytes)]


@dataclass
class Assembly:
    """One payload's frames as they come, checked against one another; whole once complete.

    A payload is cut alike on every sender (``split_payload``): every frame but the last has one
    length, so a frame's place follows from its number and length, and a frame that does not fit
    that cut is refused.  A view of an immutable message is kept as it is and joined once at the
    end; a frame in a buffer the transport lends (real mode's shared-memory slot, its stream's
    receive buffer) is copied into its place in the payload at once, its only copy, so that the
    lent buffer is not held until the whole payload is in (copying it out and joining again was
    two copies of every byte an allgather received)."""

    total: int
    count: int
    parts: dict[int, bytes] = field(default_factory=dict)   # seq -> its bytes (placed ones: a view of _into)
    size: int = 0
    step: int = 0        # the length of every frame but the last (0: none of those came yet)
    last: int = -1       # the last frame's length (-1: it has not come)
    _into: memoryview | None = None   # the payload, where lent frames were copied

    def add(self, f: Frame) -> None:
        if (f.total, f.seq_count) != (self.total, self.count):
            raise FrameError("frame disagrees with earlier frames of its payload on size or count")
        if f.seq in self.parts:
            return  # a duplicate: the first copy stands
        n = len(f.data)
        # Check before counting: a refused frame must leave the assembly as it was,
        # or the intact frames after it would be refused too.
        if self.size + n > self.total:
            raise FrameError("frames add up to more than their payload's size")
        self.step, self.last = self._cut(f.seq, n)
        self.size += n
        owner = f.data.obj if isinstance(f.data, memoryview) else f.data
        if isinstance(owner, bytes):
            self.parts[f.seq] = f.data
            return
        if self._into is None:
            # np.empty: no page is touched (or zeroed) before a frame's bytes land on it, so a frame
            # that claims a large payload holds no more memory than the frames that came
            self._into = memoryview(np.empty(self.total, np.uint8))
        at = self._place(f.seq, n)
        self._into[at:at + n] = f.data
        self.parts[f.seq] = self._into[at:at + n]

    def _place(self, seq: int, n: int) -> int:
        """Where frame ``seq`` of ``n`` bytes starts in the payload (its cut checked by ``_cut``)."""
        return self.total - n if seq == self.count - 1 else seq * n

    def _cut(self, seq: int, n: int) -> tuple[int, int]:
        """(step, last) with a frame of ``n`` bytes at ``seq``; FrameError if it does not fit the cut."""
        is_last = seq == self.count - 1
        step, last = (self.step, n) if is_last else (n, self.last)
        if not is_last and self.step and n != self.step:
            raise FrameError(f"frame {seq} has {n} bytes, its payload's other frames {self.step}")
        if self.count == 1 and n != self.total:
            raise FrameError(f"a payload of one frame has {n} bytes, not {self.total}")
        if step:
            rest = self.total - (self.count - 1) * step   # what the last frame must hold
            if not 0 < rest <= step or last >= 0 and last != rest:
                raise FrameError(f"frames of {step} bytes do not cut a payload of {self.total} into {self.count}")
        return step, last

    @property
    def complete(self) -> bool:
        return len(self.parts) == self.count and self.size == self.total

    def payload(self) -> bytes | memoryview:
        """The whole payload: joined bytes, or (where lent frames were copied into place) a writable view."""
        if self._into is None:
            return b"".join(self.parts[i] for i in range(self.count))
        for seq, part in self.parts.items():   # the frames that were kept as views go into place too
            if not (isinstance(part, memoryview) and part.obj is self._into.obj):
                at = self._place(seq, len(part))
                self._into[at:at + len(part)] = part
        self.parts.clear()
        return self._into
