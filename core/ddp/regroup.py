"""A data-parallel worker lost mid-run (``ddp.on_worker_lost``): stop, or regroup and go on.

See ``core/ddp/worker.py`` for the protocol.  Every wait has a deadline, so a
lost peer shows as a ``CollectiveTimeout`` naming the ranks it lacked; the
first survivor to time out tells the others (``LossNotice``).  ``on_loss``
decides what follows: ``stop`` reports the ranks lost, ``continue`` runs
``regroup`` attempts until a generation's leader hands every survivor the
same state (``encode_state`` / ``decode_state``: position, members, weights,
optimizer state), all of it checked as untrusted bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
import numpy as np

from dtemu.core import events as ev
from dtemu.core.ddp.collectives import Collective, CollectiveTimeout, FrameError, LossNotice
from dtemu.core.errors import RejectedUpdate
from dtemu.core.ml.params import flatten, load_flat, num_params

BARRIER_STOP = "barrier"  # how the stop_reason of a worker that never got past its barrier begins


@dataclass
class Position:
    """Where a worker is: steps done, and whether the evaluation after them is still owed."""

    step: int = 0
    eval_due: bool = False

    def epoch(self, steps_per_epoch: int) -> int:
        """The epoch of the last step done (0 before any)."""
        return max(self.step - 1, 0) // max(steps_per_epoch, 1)


def ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _pack_ranks(ranks) -> bytes:
    ranks = sorted(ranks)
    return struct.pack(f"<H{len(ranks)}H", len(ranks), *ranks)


def _unpack_ranks(data: bytes, world: int) -> list[int]:
    if len(data) < 2 or len(data) != 2 + 2 * struct.unpack_from("<H", data)[0]:
        raise FrameError("a rank list of the wrong size")
    ranks = list(struct.unpack_from(f"<{(len(data) - 2) // 2}H", data, 2))
    if any(r >= world for r in ranks):
        raise FrameError(f"a rank list names a rank outside 0..{world - 1}")
    return ranks


_STATE = struct.Struct("<QBQH")  # step, eval_due, weight count, member count; then members, weights, optimizer


def _encode_state(pos: Position, members, weights: np.ndarray, opt: bytes) -> bytes:
    members = sorted(members)
    return b"".join((_STATE.pack(pos.step, pos.eval_due, weights.size, len(members)),
                     struct.pack(f"<{len(members)}H", *members),
                     np.ascontiguousarray(weights, "<f4").tobytes(), opt))


def _decode_state(data: bytes, dim: int, world: int):
    """(position, members, weights, optimizer bytes); FrameError if malformed."""
    if len(data) < _STATE.size:
        raise FrameError("a state message shorter than its header")
    step, eval_due, n, count = _STATE.unpack_from(data)
    off = _STATE.size + 2 * count
    if n != dim or eval_due > 1 or len(data) < off + 4 * n:
        raise FrameError(f"a state message of {n} weights for a model of {dim}, or truncated")
    members = list(struct.unpack_from(f"<{count}H", data, _STATE.size))
    if not members or members != sorted(set(members)) or members[-1] >= world:
        raise FrameError(f"a state message with members {members}")
    weights = np.frombuffer(data, "<f4", n, off).astype(np.float32)
    return Position(step, bool(eval_due)), members, weights, data[off + 4 * n :]


def on_loss(ctx, d, coll: Collective, exchange, model, pos: Position, rank: int, err, result):
    """A peer is missing (``err`` a timeout) or a peer said so (a ``LossNotice``).

    Returns None when training goes on (in a new membership), else the stop reason.
    """
    world = coll.world
    if isinstance(err, CollectiveTimeout):
        suspects, what = set(err.missing), str(err)
    else:
        what = f"{err.what} (interrupted: rank {err.rank} sent {err.kind})"
        suspects = set(err.missing)
        if err.kind == "stop":
            try:
                suspects |= set(_unpack_ranks(err.payload, world))
            except FrameError:
                pass
        suspects -= {rank, err.rank}  # the teller is alive
    if d.on_worker_lost == "stop" or isinstance(err, LossNotice) and err.kind == "stop":
        lost = sorted(suspects)
        if isinstance(err, CollectiveTimeout):
            yield from coll.send_control(coll.group, "stop", _pack_ranks(lost))
        ctx.emit(ev.WORKER_LOST, ranks=lost, step=pos.step, waiting_for=what, generation=coll.group,
                 action="stop")
        result.lost_ranks = sorted(set(result.lost_ranks) | set(lost))
        return f"worker lost: {ranks_text(lost)} at step {pos.step} ({what})"

    group = coll.group + 1
    if isinstance(err, LossNotice):
        group = max(group, err.group)
    for _ in range(world):
        step = pos.step
        kind, detail, lost = yield from _regroup(ctx, d, coll, exchange, model, pos, rank, group)
        if kind == "retry":
            group = detail
            continue
        result.lost_ranks = sorted(set(result.lost_ranks) | set(lost))
        if lost or kind == "stop":
            ctx.emit(ev.WORKER_LOST, ranks=lost, step=step, waiting_for=what, generation=group,
                     action="continue" if kind == "resumed" else "stop")
        if kind == "resumed":
            members, leader = detail
            ctx.emit(ev.MEMBERSHIP, generation=group, members=members, step=pos.step, leader=leader)
            return None
        return f"worker lost: {ranks_text(lost) if lost else 'no rank'} at step {step}; {detail}"
    return f"worker lost: {ranks_text(suspects)} at step {pos.step}; no agreement after {world} regroups"


def _regroup(ctx, d, coll: Collective, exchange, model, pos: Position, rank: int, group: int):
    """One attempt at a membership of generation ``group``.

    Returns ("resumed", (members, leader), lost), ("stop", why, lost) or ("retry", the generation to
    try next, []).
    """
    min_workers = d.min_workers or d.workers
    yield from coll.send_control(group, "alive", struct.pack("<QB", pos.step, pos.eval_due))
    members = set(coll.members)
    deadline = ctx.now() + d.step_timeout_s

    def answered():
        return {rank} | (set(coll.control(group, "alive")) & members)

    def from_leader():
        """The lowest rank's ``state`` or ``stop`` of this generation, if one is lower than this rank."""
        found = [(r, "state", p) for r, p in coll.control(group, "state").items() if r < rank]
        found += [(r, "stop", p) for r, p in coll.control(group, "stop").items() if r < rank]
        return min(found, key=lambda x: x[0], default=None)

    # Who is still there: until every member answered, a leader spoke, or the window closed.
    while from_leader() is None and answered() != members:
        if coll.newest("alive") > group:
            return "retry", coll.newest("alive"), []
        if not (yield from coll.pump(deadline)):
            break
    view = sorted(answered())
    heard = from_leader()
    if heard is None and view[0] == rank:  # this rank leads
        lost = sorted(members - set(view))
        if len(view) < min_workers:
            yield from coll.send_control(group, "stop", _pack_ranks(lost))
            why = f"{len(view)} of {d.workers} workers left, fewer than ddp.min_workers ({min_workers})"
            return "stop", why, lost
        opt = exchange.state_bytes()
        yield from coll.send_control(group, "state", _encode_state(pos, view, flatten(model), opt))
        _adopt(coll, exchange, rank, group, view)
        return "resumed", (view, rank), lost

    deadline = ctx.now() + d.step_timeout_s
    while heard is None:
        if coll.newest("alive") > group:
            return "retry", coll.newest("alive"), []
        if not (yield from coll.pump(deadline)):
            return "retry", group + 1, []  # the leader is gone too
        heard = from_leader()
    leader, kind, payload = heard
    try:
        if kind == "stop":
            lost = _unpack_ranks(payload, coll.world)
            return "stop", f"the leader (rank {leader}) found fewer than ddp.min_workers ({min_workers}) left", lost
        state, new_members, weights, opt = _decode_state(payload, num_params(model), coll.world)
        lost = sorted(members - set(new_members) - {rank})
        if rank not in new_members:
            ctx.emit(ev.MEMBERSHIP, generation=group, members=new_members, step=state.step, leader=leader,
                     excluded=True)
            return "stop", f"excluded from generation {group} (members {new_members})", lost
        exchange.load_state(opt)  # checks all of it before it changes anything
        load_flat(model, weights)
    except (FrameError, RejectedUpdate) as bad:
        ctx.emit(ev.FRAME_REJECTED, src=coll.peers[leader], error=f"{kind}: {bad}")
        return "retry", group + 1, []
    pos.step, pos.eval_due = state.step, state.eval_due
    _adopt(coll, exchange, rank, group, new_members)
    return "resumed", (new_members, leader), lost


def _adopt(coll: Collective, exchange, rank: int, group: int, members) -> None:
    coll.regroup(group, members)
    exchange.regroup(coll.members.index(rank), len(coll.members))
