"""Collectives for data-parallel peers, written once on the role requests.

Every payload travels as frames on one topic (``coll/frames``), in the format of
``core.ddp.frames``, which also puts a payload's frames back together; the pipelined
allreduce's schedule is ``core.ddp.pipelined``.

Membership.  ``rank`` is always the sender's rank among all ``peers`` and
``world`` their number; ``group`` is the *generation* of the membership the
frame belongs to: 0 from the start, one more at each regroup after a loss
(``regroup(group, members)``: the collectives then run among ``members`` only).
A frame of an older generation is stale and ignored (so is one from a rank
outside the members), one of a newer generation is kept until this rank joins
it.  Three names are control messages of a regroup, kept apart from the
collectives' payloads: ``alive`` (a rank noticed a loss and asks who is still
there), ``state`` (the new generation's leader's model and membership) and
``stop`` (the sender stopped, naming the lost ranks).  An ``alive`` of a newer
generation or a ``stop`` reaching a rank in the middle of a ``wait`` ends the
wait with ``LossNotice`` (so that every survivor notices a loss as soon as the
first one does); ``core/roles/worker.py`` says what a worker does then.

A payload of one frame is kept as a view of the message it came in (no copy);
callers that need bytes get them from ``collect``.

A collective is split in two so the wait can be measured alone:
``start_allgather`` sends this rank's payload and returns a handle;
``wait`` pumps the network until every rank's payload is complete (or the
deadline passes: ``CollectiveTimeout`` names the missing ranks); ``collect``
returns the payloads in rank order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from dtemu.core.errors import AuthError, CollectiveTimeout, FrameError, LossNotice  # noqa: F401  (re-exported)
from dtemu.core.runtime.requests import Recv, Send, WaitPeers
from dtemu.core.ddp.frames import FRAME_BYTES, PIECE_BYTES, PIECES_FROM, Assembly, Frame, decode_frame, encode_frame, split_payload
from dtemu.core.wire.topics import COLL_FRAMES
from dtemu.core.ddp.pipelined import pipelined_allreduce_mean
from dtemu.core.runtime.refusal import refuse
from dtemu.core import events as ev

BARRIER_ROUND = 0xFFFFFFFF  # reserved round id of the barrier
CONTROL_NAMES = frozenset({"alive", "state", "stop"})
# Frames of a newer generation kept until this rank joins it, at most this many bytes.
FUTURE_BYTES = 64 << 20


def mean32_in_rank_order(vectors) -> np.ndarray:
    """Mean of float32 vectors summed in float32 in rank order, then divided by their number:
    ``((v0 + v1) + v2) / 3``.  What ``pipelined`` computes, whoever computes it."""
    vectors = [np.frombuffer(v, np.float32) if not isinstance(v, np.ndarray) else v for v in vectors]
    total = vectors[0].copy() if len(vectors) == 1 else np.add(vectors[0], vectors[1])
    for v in vectors[2:]:
        np.add(total, v, out=total)
    return np.divide(total, np.float32(len(vectors)), out=total)


def mean_in_rank_order(payloads: list[bytes]) -> np.ndarray:
    """Mean of float32 vectors, summed in float64 in rank order: bit-identical on every rank."""
    total = np.frombuffer(payloads[0], np.float32).astype(np.float64)
    for payload in payloads[1:]:
        np.add(total, np.frombuffer(payload, np.float32), out=total)
    np.divide(total, len(payloads), out=total)
    return total.astype(np.float32)


def _owned(payload):
    """A complete payload as the caller may keep it: one assembled (bytes, or a writable view of the
    buffer its frames were copied into) as it is; a read-only view (of a message, or of a buffer
    the transport lends: real.shm, real.stream) copied."""
    if isinstance(payload, bytes) or isinstance(payload, memoryview) and _assembled(payload):
        return payload
    return bytes(payload)


def _assembled(view: memoryview) -> bool:
    """Whether ``view`` is an ``Assembly``'s payload: over an array of its own, which nothing lends."""
    return isinstance(view.obj, np.ndarray) and view.obj.flags.writeable and not view.readonly


@dataclass
class Handle:
    round: int
    name: str
    part: int
    own: bytes
    ranks: tuple[int, ...]  # whose payloads we wait for
    started: float
    bytes_sent: int = 0


class Collective:
    """The collectives of one rank in a group of ``world`` peers named ``peers`` (by rank)."""

    def __init__(self, ctx, rank: int, peers: list[str], *, group: int = 0,
                 frame_bytes: int = FRAME_BYTES, max_payload: int = 1 << 30,
                 piece_bytes: int = PIECE_BYTES):
        self.ctx = ctx
        self.rank = rank
        self.peers = list(peers)
        self.world = len(peers)
        self.group = group
        self.frame_bytes = frame_bytes
        self.max_payload = max_payload
        # pipelined allreduce: bytes per piece, each piece one frame
        self.piece_bytes = max(4, min(piece_bytes, frame_bytes) // 4 * 4)
        self.members: tuple[int, ...] = tuple(range(self.world))  # the current generation's ranks
        self._assemblies: dict[tuple, Assembly] = {}
        self._done: dict[tuple, bytes] = {}
        self._finished_rounds: set[tuple[int, str, int]] = set()
        # Control messages, by (group, name, rank); frames of newer generations, raw.
        self._control_asm: dict[tuple, Assembly] = {}
        self._control: dict[tuple[int, str, int], bytes] = {}
        self._future: list = []
        self._future_bytes = 0
        self._notice: LossNotice | None = None
        self.counts = {"malformed": 0, "stale": 0}
        self.bytes_received = 0

    # --- membership ----------------------------------------------------
    def regroup(self, group: int, members) -> None:
        """Run the collectives of generation ``group`` among ``members`` (ranks) from now on.

        Payloads of the older generation in progress are dropped; frames already
        received for this one are filed now.
        """
        if group < self.group or self.rank not in members:
            raise ValueError(f"cannot regroup rank {self.rank} into generation {group} of {sorted(members)}")
        self.group = group
        self.members = tuple(sorted(members))
        self._assemblies.clear()
        self._done.clear()
        self._finished_rounds.clear()
        self._notice = None
        self._control = {k: v for k, v in self._control.items() if k[0] >= group}
        self._control_asm = {k: v for k, v in self._control_asm.items() if k[0] >= group}
        future, self._future, self._future_bytes = self._future, [], 0
        for msg, data in future:
            self._file(msg, data)

    @property
    def others(self) -> tuple[int, ...]:
        return tuple(r for r in self.members if r != self.rank)

    def send_control(self, group: int, name: str, payload: bytes):
        """Broadcast a control message (``alive``, ``state``, ``stop``) of generation ``group``."""
        if name not in CONTROL_NAMES:
            raise ValueError(f"{name!r} is not a control message")
        return (yield from self._send(group, name, payload, group=group))

    def control(self, group: int, name: str) -> dict[int, bytes]:
        """The control messages ``name`` of generation ``group`` received so far, by rank."""
        return {r: p for (g, n, r), p in self._control.items() if g == group and n == name}

    def newest(self, name: str) -> int:
        """The newest generation of which a control message ``name`` came in (-1: none)."""
        return max((g for g, n, _ in self._control if n == name), default=-1)

    def pump(self, deadline: float | None):
        """File one incoming frame; False if none came before ``deadline``."""
        msg = yield Recv((COLL_FRAMES,), deadline)
        if msg is None:
            return False
        self._file(msg)
        return True

    # --- sending -------------------------------------------------------
    def _send(self, round_: int, name: str, payload: bytes, part: int = 0, to: str | None = None,
              group: int | None = None):
        chunks = split_payload(payload, self.frame_bytes)
        group = self.group if group is None else group
        sent = 0
        for seq, chunk in enumerate(chunks):
            frame = encode_frame(Frame(group, round_, name, part, self.rank, self.world,
                                       seq, len(chunks), len(payload), chunk),
                                 pieces=len(chunk) >= PIECES_FROM)
            frame = self.ctx.seal(COLL_FRAMES, round_, frame)   # (the identity without a key)
            receivers = yield Send(COLL_FRAMES, frame, to=to)
            sent += len(frame) * receivers
        return sent

    def start_allgather(self, round_: int, name: str, payload: bytes):
        started = self.ctx.now()
        sent = yield from self._send(round_, name, payload)
        return Handle(round_, name, 0, payload, self.others, started, sent)

    # --- receiving -----------------------------------------------------
    def wait(self, handle: Handle, deadline: float | None, what: str = "allgather"):
        """Pump frames until every payload of ``handle`` is in; CollectiveTimeout otherwise
        (or LossNotice if a peer's ``alive`` or ``stop`` comes first)."""
        keys = [(handle.round, handle.name, handle.part, r) for r in handle.ranks]
        while not all(k in self._done for k in keys):
            if self._notice is not None:
                notice, self._notice = self._notice, None
                notice.what = f"{what} {handle.name}@{handle.round}"
                notice.missing = [k[3] for k in keys if k not in self._done]
                raise notice
            msg = yield Recv((COLL_FRAMES,), deadline)
            if msg is None:
                missing = [k[3] for k in keys if k not in self._done]
                raise CollectiveTimeout(f"{what} {handle.name}@{handle.round}", missing,
                                        self.ctx.now() - handle.started)
            self._file(msg)

    def collect(self, handle: Handle) -> list[bytes]:
        """The payloads of ``handle`` in rank order (this rank's own included)."""
        out = {self.rank: handle.own}
        for r in handle.ranks:
            out[r] = _owned(self._done.pop((handle.round, handle.name, handle.part, r)))
        self._finished_rounds.add((handle.round, handle.name, handle.part))
        return [out[r] for r in sorted(out)]

    def _file(self, msg, data=None) -> None:
        """File one message's frame; ``data``: the frame, already taken out of its envelope (a frame
        of a newer generation kept for later, which must not be opened twice: it would be a replay)."""
        try:
            if data is None:
                data = self.ctx.open(msg)
            f = decode_frame(data, world=self.world, max_total=self.max_payload)
            if f.name in CONTROL_NAMES:
                self._file_control(f, len(msg.data))
                return
            if f.group > self.group:  # a newer generation, which this rank may be about to join
                if self._future_bytes + len(msg.data) <= FUTURE_BYTES:
                    self._future.append((msg, data))
                    self._future_bytes += len(msg.data)
                return
            if f.group != self.group or f.rank not in self.members:
                self.counts["stale"] += 1
                return
            if (f.round, f.name, f.part) in self._finished_rounds:
                self.counts["stale"] += 1
                return
            key = (f.round, f.name, f.part, f.rank)
            if key in self._done:
                return  # a duplicate of a payload already complete
            asm = self._assemblies.get(key)
            if asm is None and f.seq_count == 1:  # the whole payload: kept as a view, not copied
                if len(f.data) != f.total:
                    raise FrameError(f"a payload of one frame has {len(f.data)} bytes, not {f.total}")
                self.bytes_received += len(msg.data)
                self._done[key] = f.data
                return
            if asm is None:
                asm = self._assemblies[key] = Assembly(f.total, f.seq_count)
            asm.add(f)
            self.bytes_received += len(msg.data)
            if asm.complete:
                self._done[key] = asm.payload()
                del self._assemblies[key]
        except (FrameError, AuthError) as err:
            reason = getattr(err, "reason", "malformed")  # (an AuthError's: unsigned, forged, replayed)
            refuse(self.ctx, self.counts, msg, reason, ev.FRAME_REJECTED, src=msg.src, error=str(err),
                   **({"reason": reason} if reason != "malformed" else {}))

    def _file_control(self, f: Frame, nbytes: int) -> None:
        if f.group < self.group or f.rank == self.rank:
            self.counts["stale"] += 1
            return
        key = (f.group, f.name, f.rank)
        if key in self._control:
            return
        asm = self._control_asm.get(key)
        if asm is None:
            asm = self._control_asm[key] = Assembly(f.total, f.seq_count)
        asm.add(f)
        self.bytes_received += nbytes
        if not asm.complete:
            return
        payload = self._control[key] = asm.payload()
        del self._control_asm[key]
        if self._notice is None and (f.name == "alive" and f.group > self.group
                                     or f.name == "stop" and f.rank in self.members):
            self._notice = LossNotice(f.name, f.rank, f.group, payload)

    # --- collectives ---------------------------------------------------
    def allgather(self, round_: int, name: str, payload: bytes, deadline: float | None):
        handle = yield from self.start_allgather(round_, name, payload)
        yield from self.wait(handle, deadline)
        return self.collect(handle)

    def barrier(self, deadline: float | None):
        """Every peer matched, then every peer heard from; names the missing ranks otherwise."""
        started = self.ctx.now()
        others = tuple(self.peers[r] for r in self.others)
        matched = yield WaitPeers(others, deadline)
        missing = [self.peers.index(p) for p in others if p not in matched]
        if missing:
            raise CollectiveTimeout("barrier (matching)", missing, self.ctx.now() - started)
        yield from self.allgather(BARRIER_ROUND, "barrier", struct.pack("<H", self.rank), deadline)

    def allreduce_mean(self, round_: int, vec: np.ndarray, deadline: float | None, algorithm: str = "gather"):
        """The element-wise mean of every rank's float32 ``vec``.

        ``gather``: every rank sends its whole vector to every other (the
        original's dense broadcast), then sums in rank order.  ``ring``:
        reduce-scatter then allgather around the ring, 2(W-1)/W of the vector
        sent per rank.  Both give every rank bit-identical results, summed in
        float64.  ``pipelined`` (``core.ddp.pipelined``): every rank sends each
        other rank its shard of the vector in pieces, owners sum the pieces as
        they come in float32 in rank order and send each finished piece to all,
        the same 2(W-1)/W sent per rank in two steps instead of 2(W-1); its
        result is ``mean32_in_rank_order`` of the vectors, bit-identical on
        every rank (and not the float64 mean of the other two).  W is the
        number of members of the current generation.
        """
        vec = np.ascontiguousarray(vec, dtype=np.float32)
        if algorithm == "gather":
            handle = yield from self.start_allgather(round_, "dense", vec.tobytes())
            yield from self.wait(handle, deadline, what="allreduce")
            return mean_in_rank_order(self.collect(handle)), handle.bytes_sent
        if algorithm == "ring":
            return (yield from self._ring_allreduce(round_, vec, deadline))
        if algorithm == "pipelined":
            return (yield from pipelined_allreduce_mean(self, round_, vec, deadline))
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}")

    def _ring_allreduce(self, round_: int, vec: np.ndarray, deadline):
        # r: this rank's place on the ring of members
        members = self.members
        w, r = len(members), members.index(self.rank)
        if w == 1:
            return vec.copy(), 0
        chunks = [c.astype(np.float64) for c in np.array_split(vec, w)]
        nxt, prev = self.peers[members[(r + 1) % w]], members[(r - 1) % w]
        sent = 0
        # reduce-scatter: after w-1 steps rank r holds the full sum of chunk (r+1) % w
        for step in range(w - 1):
            send_i, recv_i = (r - step) % w, (r - step - 1) % w
            sent += yield from self._send(round_, "ring_rs", chunks[send_i].astype(np.float32).tobytes(),
                                          part=step, to=nxt)
            got = yield from self._recv_one(round_, "ring_rs", step, prev, deadline)
            chunks[recv_i] = chunks[recv_i] + np.frombuffer(got, np.float32)
        # allgather: pass the reduced chunks around
        chunks = [c.astype(np.float32) for c in chunks]
        for step in range(w - 1):
            send_i, recv_i = (r + 1 - step) % w, (r - step) % w
            sent += yield from self._send(round_, "ring_ag", chunks[send_i].tobytes(), part=step, to=nxt)
            got = yield from self._recv_one(round_, "ring_ag", step, prev, deadline)
            chunks[recv_i] = np.frombuffer(got, np.float32).copy()
        return np.concatenate(chunks) / np.float32(w), sent

    def _recv_one(self, round_, name, part, rank, deadline):
        handle = Handle(round_, name, part, b"", (rank,), self.ctx.now())
        yield from self.wait(handle, deadline, what="ring allreduce")
        self._finished_rounds.add((round_, name, part))
        return _owned(self._done.pop((round_, name, part, rank)))

    # --- piece by piece (core.ddp.pipelined) ----------------------------
    def wait_any(self, keys, deadline: float | None, what: str, started: float):
        """Pump frames until at least one payload of ``keys`` ((round, name, part, rank)
        tuples) is complete; returns those that are.  Times out or ends on a loss notice as
        ``wait`` does."""
        while True:
            ready = [k for k in keys if k in self._done]
            if ready:
                return ready
            if self._notice is not None:
                notice, self._notice = self._notice, None
                notice.what, notice.missing = what, sorted({k[3] for k in keys})
                raise notice
            msg = yield Recv((COLL_FRAMES,), deadline)
            if msg is None:
                raise CollectiveTimeout(what, {k[3] for k in keys}, self.ctx.now() - started)
            self._file(msg)

    def poll(self, keys):
        """File the frames already in, without waiting; the payloads of ``keys`` now complete."""
        while (msg := (yield Recv((COLL_FRAMES,), self.ctx.now()))) is not None:
            self._file(msg)
        return [k for k in keys if k in self._done]

    def take(self, key):
        """The complete payload ``key`` (a view, or bytes)."""
        return self._done.pop(key)

    def finish(self, parts) -> None:
        """Frames of these (round, name, part) from now on are stale; copies already in are dropped."""
        parts = set(parts)
        self._finished_rounds |= parts
        for key in [k for k in self._done if k[:3] in parts]:
            del self._done[key]

    def refuse_payload(self, key, payload, why: str) -> None:
        """A payload that decoded but does not fit the collective (e.g. a piece of the
        wrong size): counted and reported like a malformed frame; the wait goes on."""
        self.counts["malformed"] += 1
        self.ctx.emit(ev.FRAME_REJECTED, src=self.peers[key[3]], error=why)
