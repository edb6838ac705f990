"""The data-parallel worker, written once for both runtimes.

Each step: forward/backward on this rank's batch, exchange gradients with the
other ranks (a dense allreduce, or DGC's sparse allgather), average them, take
the optimizer step.  Every step is profiled — bytes sent and received, compute,
compression, sending and the pure wait for the others — and reported per step
and per window of ``ddp.window`` steps (mean and max).

A worker lost mid-run (``ddp.on_worker_lost``).  Every wait has a deadline, so
a lost peer shows as a ``CollectiveTimeout`` naming the ranks it lacked; the
first survivor to time out tells the others (a control message that ends their
own waits at once, ``LossNotice``), so that nobody waits for its own timeout.

- ``stop``: the survivor broadcasts ``stop`` (the ranks it lacked), emits
  ``worker_lost`` (ranks, step, what it was waiting for) and returns a result
  with ``stop_reason`` and ``lost_ranks``; a survivor told so reports the same
  ranks (less itself and the teller, who are alive).
- ``continue``: a regroup into generation g+1.  Each survivor broadcasts
  ``alive`` and listens for the others' for ``step_timeout_s`` (less if every
  member answers); who answered is the new membership.  Survivors may be one
  step apart (the lost rank's last payload reached some and not others), so
  the lowest survivor, the leader, broadcasts its ``state`` — membership, step,
  weights, optimizer momentum — and everyone resumes from it, identical: the
  others drop what they did since.  A survivor that hears no leader within
  another ``step_timeout_s`` tries generation g+2 (at most ``workers`` times).
  Fewer than ``ddp.min_workers`` survivors stop as ``stop`` does (the leader
  says ``stop``).  The collectives then run among the members, averaging over
  them only, and each survivor keeps its own data shard; the test set is split
  among the members.  DGC's residuals stay local (``dgc_exchange.py``).
  Events: ``worker_lost`` and ``membership`` (generation, members, step, leader).
- A survivor that is not in the leader's membership (its ``alive`` came too
  late) stops, as ``excluded``.  A lost rank that comes back (a restarted
  process, emu's ``faults.offline`` with ``end_s``) does not rejoin: it starts
  from scratch at generation 0, whose frames the survivors ignore, and its
  barrier fails (``stop_reason`` "barrier: ...") — refused, never mixed in.

The agreement assumes crashes, not partitions: survivors that can all reach one
another notice a loss within one step of each other, well inside the window.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from dtemu.core.ddp.collectives import Collective, CollectiveTimeout, FrameError, LossNotice
from dtemu.core.errors import RejectedUpdate
from dtemu.core.ml.params import flatten, load_flat, num_params, sha256_of
from dtemu.core.runtime.requests import Compute
from dtemu.core.scenario import Scenario
from dtemu.core.ml.workload import Workload
from dtemu.core.ddp.exchange import make_exchange

PROFILE_KEYS = ("bytes_sent", "bytes_received", "compute_s", "compress_s", "send_s", "wait_s", "comm_s")
BARRIER_STOP = "barrier"  # how the stop_reason of a worker that never got past its barrier begins


@dataclass
class WorkerResult:
    weights: np.ndarray
    steps: int = 0
    final_accuracy: float | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    counts: dict = field(default_factory=dict)
    # After a loss: why this worker stopped (None: it finished), the ranks the group lost,
    # and the membership it ended in (generation 0: the original one).
    stop_reason: str | None = None
    lost_ranks: list[int] = field(default_factory=list)
    members: list[int] = field(default_factory=list)
    generation: int = 0


class _Window:
    """Mean and max of the profile over the last ``size`` steps."""

    def __init__(self, size: int):
        self.size = size
        self.rows: list[dict] = []

    def add(self, row: dict) -> dict | None:
        self.rows.append(row)
        if len(self.rows) < self.size:
            return None
        return self.flush()

    def flush(self) -> dict | None:
        if not self.rows:
            return None
        out = {"steps": len(self.rows), "first_step": self.rows[0]["step"]}
        for key in PROFILE_KEYS:
            values = [r[key] for r in self.rows]
            out[f"{key}_mean"] = round(float(np.mean(values)), 9)
            out[f"{key}_max"] = round(float(np.max(values)), 9)
        self.rows = []
        return out


@dataclass
class _Position:
    """Where a worker is: steps done, and whether the evaluation after them is still owed."""

    step: int = 0
    eval_due: bool = False

    def epoch(self, steps_per_epoch: int) -> int:
        """The epoch of the last step done (0 before any)."""
        return max(self.step - 1, 0) // max(steps_per_epoch, 1)


def worker(ctx, scenario: Scenario, work: Workload, rank: int):
    d = scenario.ddp
    peers = scenario.worker_names
    coll = Collective(ctx, rank, peers, frame_bytes=d.frame_bytes, max_payload=64 * work.dim + (1 << 20))
    model = work.new_model()
    exchange = make_exchange(scenario, model, rank, len(peers), work.steps_per_epoch)
    result = WorkerResult(weights=np.empty(0, np.float32))
    ctx.emit("worker_start", rank=rank, world=len(peers), dim=work.dim,
             steps_per_epoch=work.steps_per_epoch, compression=d.compression)
    try:
        yield from coll.barrier(ctx.now() + d.barrier_timeout_s)
    except (CollectiveTimeout, LossNotice) as err:
        # A peer missing at the start, or (a restarted rank) a group that has moved on.
        missing = err.missing
        ctx.emit("barrier_failed", missing=missing, error=str(err))
        result.stop_reason = f"{BARRIER_STOP}: {_ranks(missing)} missing ({err})"
        result.lost_ranks = list(missing)
        return _finish(ctx, coll, model, result, 0)
    ctx.emit("barrier", matched=peers)

    spe = work.steps_per_epoch
    total_steps = d.epochs * spe
    if d.max_steps is not None:
        total_steps = min(total_steps, d.max_steps)
    pos = _Position(eval_due=total_steps == 0)
    window = _Window(d.window)
    batches: dict[int, list] = {}
    while pos.step < total_steps or pos.eval_due:
        try:
            if pos.eval_due:
                epoch = pos.epoch(spe)
                accuracy = yield from _evaluate(ctx, coll, work, model, rank, epoch, d.step_timeout_s)
                result.final_accuracy = accuracy
                ctx.emit("eval", epoch=epoch, step=pos.step, accuracy=accuracy)
                pos.eval_due = False
                continue
            epoch, i = divmod(pos.step, spe)
            if epoch not in batches:
                batches = {epoch: work.worker_batches(rank, epoch)}
            row = yield from _step(ctx, d, coll, exchange, work, model, rank, pos.step, batches[epoch][i])
            result.bytes_sent += row["bytes_sent"]
            result.bytes_received += row["bytes_received"]
            summary = window.add(row)
            if summary:
                ctx.emit("window", epoch=epoch, **summary)
            pos.step += 1
            if pos.step % spe == 0 or pos.step >= total_steps:  # the end of an epoch
                last = epoch == d.epochs - 1 or pos.step >= total_steps
                pos.eval_due = (epoch + 1) % d.eval_every_epochs == 0 or last
        except (CollectiveTimeout, LossNotice) as err:
            stop = yield from _on_loss(ctx, d, coll, exchange, model, pos, rank, err, result)
            if stop is not None:
                result.stop_reason = stop
                break
    summary = window.flush()
    if summary:
        ctx.emit("window", epoch=pos.epoch(spe), **summary)
    return _finish(ctx, coll, model, result, pos.step)


def _step(ctx, d, coll: Collective, exchange, work: Workload, model, rank: int, step: int, batch):
    """One training step; its profile row.  Nothing changes if a wait fails."""
    epoch = step // work.steps_per_epoch
    t0 = ctx.now()
    loss = yield Compute(lambda: work.gradients(model, batch, rank, step), samples=len(batch))
    t1 = ctx.now()
    payload = yield Compute(lambda: exchange.compress(step), kind="compress")
    t2 = ctx.now()
    received_before = coll.bytes_received
    yield from exchange.send(coll, step, payload)
    t3 = ctx.now()
    yield from exchange.wait(coll, step, t3 + d.step_timeout_s)
    t4 = ctx.now()
    yield Compute(lambda: exchange.apply(coll, step), kind="compress")
    row = {
        "step": step,
        "bytes_sent": exchange.sent,
        "bytes_received": coll.bytes_received - received_before,
        "compute_s": round(t1 - t0, 9),
        "compress_s": round(t2 - t1 + ctx.now() - t4, 9),
        "send_s": round(t3 - t2, 9),
        "wait_s": round(t4 - t3, 9),
        "comm_s": round(t4 - t2, 9),
    }
    ctx.emit("step", epoch=epoch, loss=round(loss, 6), density=exchange.density(step), **row)
    return row


def _finish(ctx, coll: Collective, model, result: WorkerResult, steps: int) -> WorkerResult:
    result.weights = flatten(model)
    result.steps = steps
    result.counts = dict(coll.counts)
    result.members = list(coll.members)
    result.generation = coll.group
    extra = {}
    if result.stop_reason is not None or result.lost_ranks:
        extra = {"stop_reason": result.stop_reason, "lost_ranks": result.lost_ranks,
                 "members": result.members, "generation": result.generation}
    ctx.emit("worker_end", steps=steps, model_sha256=sha256_of(result.weights),
             bytes_sent=result.bytes_sent, bytes_received=result.bytes_received, counts=result.counts, **extra)
    return result


def _evaluate(ctx, coll: Collective, work: Workload, model, rank: int, epoch: int, timeout_s: float):
    """Every member tests its share; the (correct, total) counts are allgathered."""
    index, size = coll.members.index(rank), len(coll.members)
    correct, total = yield Compute(lambda: work.evaluate_shard(model, index, size),
                                   samples=work.test_size // size, kind="eval")
    payloads = yield from coll.allgather(epoch, "eval", struct.pack("<QQ", correct, total),
                                         ctx.now() + timeout_s)
    if any(len(p) != 16 for p in payloads):
        raise FrameError("an evaluation count payload is not 16 bytes")
    counts = np.array([struct.unpack("<QQ", p) for p in payloads])
    return float(counts[:, 0].sum() / counts[:, 1].sum())


# --- a worker lost ------------------------------------------------------------------

def _ranks(ranks) -> str:
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


def _encode_state(pos: _Position, members, weights: np.ndarray, opt: bytes) -> bytes:
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
    return _Position(step, bool(eval_due)), members, weights, data[off + 4 * n :]


def _on_loss(ctx, d, coll: Collective, exchange, model, pos: _Position, rank: int, err, result: WorkerResult):
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
        ctx.emit("worker_lost", ranks=lost, step=pos.step, waiting_for=what, generation=coll.group,
                 action="stop")
        result.lost_ranks = sorted(set(result.lost_ranks) | set(lost))
        return f"worker lost: {_ranks(lost)} at step {pos.step} ({what})"

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
            ctx.emit("worker_lost", ranks=lost, step=step, waiting_for=what, generation=group,
                     action="continue" if kind == "resumed" else "stop")
        if kind == "resumed":
            members, leader = detail
            ctx.emit("membership", generation=group, members=members, step=pos.step, leader=leader)
            return None
        return f"worker lost: {_ranks(lost) if lost else 'no rank'} at step {step}; {detail}"
    return f"worker lost: {_ranks(suspects)} at step {pos.step}; no agreement after {world} regroups"


def _regroup(ctx, d, coll: Collective, exchange, model, pos: _Position, rank: int, group: int):
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
            ctx.emit("membership", generation=group, members=new_members, step=state.step, leader=leader,
                     excluded=True)
            return "stop", f"excluded from generation {group} (members {new_members})", lost
        exchange.load_state(opt)  # checks all of it before it changes anything
        load_flat(model, weights)
    except (FrameError, RejectedUpdate) as bad:
        ctx.emit("frame_rejected", src=coll.peers[leader], error=f"{kind}: {bad}")
        return "retry", group + 1, []
    pos.step, pos.eval_due = state.step, state.eval_due
    _adopt(coll, exchange, rank, group, new_members)
    return "resumed", (new_members, leader), lost


def _adopt(coll: Collective, exchange, rank: int, group: int, members) -> None:
    coll.regroup(group, members)
    exchange.regroup(coll.members.index(rank), len(coll.members))
