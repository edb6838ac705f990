"""The pipelined allreduce: reduce-scatter and allgather in pieces that overlap, float32 in rank order.

The vector is cut into W shards (as ``np.array_split`` cuts it), shard ``i``
owned by the i-th member; every shard into pieces of at most
``coll.piece_bytes`` (one frame each).  Then, on every rank:

1. send each other member, piece by piece, its shard of this rank's vector
   (``pag``/``prs`` frames are addressed: only their destination reads them
   when the transport can route them so);
2. as the pieces of its own shard come in, and as soon as a piece has every
   member's contribution, sum them in float32 **in rank order**
   (``(x0 + x1) + x2``), divide by W, write the result straight into the
   output vector and send that piece to every other member;
3. copy the other owners' finished pieces into the output as they arrive.

Each element is summed by one rank only, in an order fixed by the ranks, so
every rank ends with the same bits: ``mean32_in_rank_order`` of the vectors,
whatever the piece size or the order of arrival.  Per rank, 2(W-1)/W of the
vector goes out (the ring's volume) in two steps (the ring takes 2(W-1)), and
a piece is summed while the next ones are on the wire.  Nothing is copied on
the way in except by the sum and the final copy into the output.

Written on the role requests (``Send``/``Recv`` through ``Collective``), so
the emulator runs the same schedule.
"""

from __future__ import annotations

import numpy as np

from dtemu.core.errors import CollectiveTimeout, LossNotice


def shard_bounds(n: int, w: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of ``w`` shards of ``n`` elements (np.array_split's cut)."""
    size, extra = divmod(n, w)
    bounds, lo = [], 0
    for i in range(w):
        hi = lo + size + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def piece_bounds(lo: int, hi: int, piece_floats: int) -> list[tuple[int, int]]:
    return [(a, min(a + piece_floats, hi)) for a in range(lo, hi, piece_floats)]


def _bytes_of(arr: np.ndarray) -> memoryview:
    return memoryview(arr).cast("B")  # no copy; the frame encoder copies it once


def to_blame(waiting) -> set[int]:
    """The ranks a wait that ended names as missing: those whose own pieces ("prs", sent whatever
    the others do) are missing.  A finished piece ("pag") waits on every member's contribution, so
    a live owner blocked by a lost rank is named only when no contribution is missing (its owner
    died after the others had sent theirs)."""
    own = {rank for _, name, _, rank in waiting if name == "prs"}
    return own or {rank for *_, rank in waiting}


def pipelined_allreduce_mean(coll, round_: int, vec: np.ndarray, deadline: float | None):
    """The mean of every member's float32 ``vec`` (see the module docstring); (mean, bytes sent)."""
    members = coll.members
    w, me = len(members), members.index(coll.rank)
    if w == 1:
        return vec.copy(), 0
    started = coll.ctx.now()
    what = f"pipelined allreduce @{round_}"
    piece_floats = coll.piece_bytes // 4
    pieces = [piece_bounds(lo, hi, piece_floats) for lo, hi in shard_bounds(len(vec), w)]
    out = np.empty_like(vec)
    scale = np.float32(w)
    sent = 0

    # What to wait for: pieces of this rank's shard from every peer ("prs"), and every
    # other owner's finished pieces ("pag").
    peers = [(me + k) % w for k in range(1, w)]  # from the next rank on, so owners are not all hit at once
    waiting = {(round_, "prs", k, members[i]) for k in range(len(pieces[me])) for i in peers}
    waiting |= {(round_, "pag", k, members[i]) for i in peers for k in range(len(pieces[i]))}
    contributions: dict[int, dict[int, np.ndarray]] = {k: {} for k in range(len(pieces[me]))}
    index = {r: i for i, r in enumerate(members)}

    def file(keys):
        """Take the complete payloads ``keys``; sum and pass on the pieces that are whole."""
        sent = 0
        for key in keys:
            _, name, k, rank = key
            i = index[rank]
            lo, hi = pieces[me][k] if name == "prs" else pieces[i][k]
            data = coll.take(key)
            if len(data) != 4 * (hi - lo):
                coll.refuse_payload(key, data, f"{name} piece {k} of {len(data)} bytes, expected {4 * (hi - lo)}")
                continue  # an honest copy may still come
            waiting.discard(key)
            got = np.frombuffer(data, np.float32)
            if name == "pag":
                out[lo:hi] = got
                continue
            contributions[k][i] = got
            if len(contributions[k]) < w - 1:
                continue
            xs = [vec[lo:hi] if j == me else contributions[k][j] for j in range(w)]
            del contributions[k]
            acc = out[lo:hi]
            np.add(xs[0], xs[1], out=acc)
            for x in xs[2:]:
                np.add(acc, x, out=acc)
            np.divide(acc, scale, out=acc)
            sent += yield from coll._send(round_, "pag", _bytes_of(acc), part=k)
        return sent

    # 1. reduce-scatter, piece by piece; between pieces, whatever came in is summed and passed on
    for k in range(max(len(p) for p in pieces)):
        for i in peers:
            if k < len(pieces[i]):
                lo, hi = pieces[i][k]
                sent += yield from coll._send(round_, "prs", _bytes_of(vec[lo:hi]), part=k,
                                              to=coll.peers[members[i]])
        sent += yield from file((yield from coll.poll(list(waiting))))
    # 2. and 3.: the rest as it comes
    while waiting:
        try:
            ready = yield from coll.wait_any(list(waiting), deadline, what, started)
        except CollectiveTimeout:
            raise CollectiveTimeout(what, to_blame(waiting), coll.ctx.now() - started) from None
        except LossNotice as notice:
            notice.missing = sorted(to_blame(waiting))
            raise
        sent += yield from file(ready)
    coll.finish({(round_, name, k) for name in ("prs", "pag") for k in range(max(map(len, pieces)))})
    return out, sent
