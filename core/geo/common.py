"""What every geo role shares: the model as a flat vector, the round's data, collecting a round's
payloads, and the tally of bytes that crossed the WAN."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from dtemu.core import events as ev
from dtemu.core.errors import AuthError, GeoPayloadError
from dtemu.core.geo.payload import BEAT, END, JOIN, STATE, Payload, decode, encode_dense
from dtemu.core.ml.batches import epoch_order
from dtemu.core.runtime.requests import Recv
from dtemu.core.wire.topics import GEO_PULL, GEO_PUSH  # noqa: F401 (the roles' topics)
from dtemu.core.runtime.refusal import refuse



@dataclass
class GeoResult:
    """What a geo role returns (summary.json reads it through ``core.geo.report``)."""

    role: str
    site: str
    rounds: int = 0
    weights: np.ndarray | None = None          # master and workers: the model they end with
    final_accuracy: float | None = None
    history: list = field(default_factory=list)  # master: (time, accuracy) of every evaluation
    wan_sent: int = 0                            # bytes of the rounds this node sent across the WAN
    wan_received: int = 0                        # ... and received from across it
    wan_init: int = 0                            # bytes of the initial model it sent across the WAN
    comm_s: list = field(default_factory=list)  # worker: push to pull, per round
    rejected: int = 0                            # payloads refused (malformed, unknown sender, stale)
    stop_reason: str | None = None
    lost: list = field(default_factory=list)    # nodes this role gave up waiting for


# --- the model as one flat vector of its parameters -------------------------------
def params_of(model) -> list[torch.Tensor]:
    return list(model.parameters())


def get_vector(model) -> np.ndarray:
    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in params_of(model)]).numpy().astype(np.float32)


def grad_vector(model) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in params_of(model)]).numpy().astype(np.float32)


def set_vector(model, vec: np.ndarray) -> None:
    src = torch.from_numpy(np.array(vec, dtype=np.float32))
    off = 0
    with torch.no_grad():
        for p in params_of(model):
            p.copy_(src[off:off + p.numel()].view_as(p))
            off += p.numel()


class Applier:
    """Turns what comes down (an aggregated gradient, or weights) into the model; the same
    on every worker and on the master, so their models stay bit-identical.  ``lr_at`` gives a
    round's learning rate (``GeoSpec.lr_at``): a step schedule changes it between rounds, and
    torch's SGD keeps its momentum buffer in gradient units, so the new rate applies at once."""

    def __init__(self, model, lr_at: Callable[[int], float], momentum: float, weights_mode: bool):
        self.model, self.weights_mode, self.lr_at = model, weights_mode, lr_at
        self.opt = torch.optim.SGD(params_of(model), lr=lr_at(1), momentum=momentum)

    def apply(self, vec: np.ndarray, round_: int) -> None:
        if self.weights_mode:
            set_vector(self.model, vec)
            return
        src = torch.from_numpy(np.array(vec, dtype=np.float32))
        off = 0
        for p in params_of(self.model):
            p.grad = src[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        set_lr(self.opt, self.lr_at(round_))
        self.opt.step()


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def site_downlink(pull: Payload, raw: bytes, fp16: bool) -> bytes:
    """What a local PS forwards to its workers from the global PS's pull: dense (half precision
    under FP16); a sparse aggregate is expanded first, a dense one goes on as it came."""
    if pull.sparse:
        return encode_dense(pull.round, pull.dense(), fp16)
    return raw


def worker_optimizer_momentum(geo) -> float:
    """BiSparse keeps the momentum in its residuals (momentum correction): plain SGD then."""
    return 0.0 if geo.sparse else geo.momentum


# --- data ------------------------------------------------------------------------
def round_batch(work, scenario, index: int, round_: int) -> np.ndarray:
    """Worker ``index``'s batch of ``round_`` (1-based): its shard of an even split of the
    training set, reshuffled every epoch from (seed, index, epoch)."""
    shard = work.split(len(scenario.training_nodes))[index]
    b = scenario.geo.batch_size
    per_epoch = max(1, len(shard) // b)
    epoch, i = divmod(round_ - 1, per_epoch)
    return epoch_order(shard, (scenario.seed, index), epoch)[i * b:(i + 1) * b]


# --- receiving a round ---------------------------------------------------------------
SILENT_BEATS = 3   # heartbeats missed before a sender counts as lost


@dataclass
class Beat:
    """A role's heartbeat: ``send()`` is a generator that sends one; every ``every`` seconds while
    the role waits in an inbox."""

    send: object
    every: float
    next: float | None = None


class Inbox:
    """Collects one round's payloads from the expected senders; everything else is refused and
    counted (malformed, unknown sender, a round already closed), never applied."""

    def __init__(self, ctx, topic: str, dim: int, site_of: dict[str, str], site: str, result: GeoResult):
        self.ctx, self.topic, self.dim = ctx, topic, dim
        self.site_of, self.site, self.result = site_of, site, result
        self.early: dict[tuple[int, str], tuple[Payload, bytes]] = {}
        # Heartbeats (geo.heartbeat_s): ``beat`` (a ``Beat``, shared by a role's inboxes): sent
        # while this inbox waits; ``watch`` = period: a sender silent for SILENT_BEATS periods is
        # given up before the round's deadline.  ``heard``: when each sender was last heard.
        self.beat: Beat | None = None
        self.watch: float | None = None
        self.heard: dict[str, float] = {}
        self.loss_reason = "timeout"
        # Joining (core.geo.join): ``joinable``: nodes not in a round's senders whose JOIN (or beat)
        # is welcome; ``joins``: who said JOIN after the start (a newcomer, or a member that started
        # again: it is not waited for any more); ``state_ok``: a STATE (the model of a running run)
        # answers a wait for the initial model; ``restarts``: the one sender (a worker's local PS)
        # whose STATE also answers a wait for a round's pull: it started again and was let in anew
        # (the STATE is the model of that round or a later one, never of an earlier one).
        self.joinable: set[str] = set()
        self.joins: list[str] = []
        self.state_ok = False
        self.restarts: str | None = None
        # MixedSync's END (core.geo.payload): the last update the run sent; a wait for a later one
        # returns at once, without it.
        self.end: int | None = None

    def _wake(self, deadline: float | None, waiting: list[str]) -> float | None:
        """When to look up from the inbox: the deadline, the next beat to send, the next silence."""
        times = [deadline] if deadline is not None else []
        if self.beat is not None:
            times.append(self.beat.next)
        if self.watch is not None:
            times += [self.heard[s] + SILENT_BEATS * self.watch for s in waiting]
        return min(times) if times else None

    def _refuse(self, msg, reason: str, error: str = "") -> None:
        self.result.rejected += 1   # (geo counts its refusals as one number)
        refuse(self.ctx, None, msg, reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src, reason=reason,
               **({"error": error} if error else {}))

    def _decoded(self, msg, senders):
        """(``msg``'s payload, the bytes inside its envelope: what a PS forwards), or None when it is
        refused (not from one of ``senders``, not authentic under the run's key, or malformed)."""
        if msg.src not in senders:
            self._refuse(msg, "unknown_sender")
            return None
        try:
            inner = self.ctx.open(msg)
            return decode(inner, self.dim), inner
        except AuthError as err:
            self._refuse(msg, err.reason, str(err))
        except GeoPayloadError as err:
            self._refuse(msg, "malformed", str(err))
        return None

    def collect(self, senders: list[str], round_: int, deadline: float | None, count_wan: bool = True):
        """{sender: (payload, raw bytes)} of ``round_``; fewer than ``senders`` when the deadline passed."""
        got = {s: self.early.pop((round_, s)) for s in senders if (round_, s) in self.early}
        if self.end is not None and round_ > self.end:
            return got
        now = self.ctx.now()
        for s in senders:
            self.heard.setdefault(s, now)
        if self.beat is not None and self.beat.next is None:
            self.beat.next = now + self.beat.every
        self.loss_reason = "timeout"
        while pending := [s for s in senders if s not in got and s not in self.joins]:
            msg = yield Recv((self.topic,), self._wake(deadline, pending))
            now = self.ctx.now()
            if msg is None:
                if deadline is not None and now >= deadline:
                    break
                if self.beat is not None and now >= self.beat.next:
                    yield from self.beat.send()
                    self.beat.next = self.ctx.now() + self.beat.every
                if self.watch is not None and any(now >= self.heard[s] + SILENT_BEATS * self.watch
                                                  for s in pending):
                    self.loss_reason = "heartbeat"
                    break
                continue
            outsider = msg.src not in senders and msg.src in self.joinable
            opened = self._decoded(msg, self.joinable if outsider else senders)
            if opened is None:
                continue
            payload, inner = opened
            self.heard[msg.src] = now
            if payload.kind in (BEAT, JOIN) and (outsider or (payload.kind == JOIN and round_ > 0)):
                # a newcomer's hello, or a member that started again (it will not push this round)
                if payload.kind == JOIN and msg.src not in self.joins:
                    self.joins.append(msg.src)
                if self.site_of.get(msg.src) != self.site:
                    self.result.wan_received += len(msg.data)
                continue
            if outsider:
                self._refuse(msg, "unknown_sender")   # not a member (yet): its pushes are not used
                continue
            if payload.kind in (BEAT, END):
                if self.site_of.get(msg.src) != self.site:
                    self.result.wan_received += len(msg.data)
                if payload.kind == END:
                    self.end = payload.round if self.end is None else min(self.end, payload.round)
                    if round_ > self.end:
                        break
                continue
            if payload.kind == STATE:   # the model of a run already going: for a newcomer, or from a restarted PS
                if self.state_ok or (msg.src == self.restarts and payload.round >= round_):
                    got[msg.src] = (payload, inner)
                else:
                    self._refuse(msg, "unexpected_state")
                continue
            if payload.round < round_ or (payload.round == round_ and msg.src in got):
                self._refuse(msg, "stale" if payload.round < round_ else "duplicate")
                continue
            if count_wan and self.site_of.get(msg.src) != self.site:
                self.result.wan_received += len(msg.data)
            if payload.round > round_:
                self.early[(payload.round, msg.src)] = (payload, inner)
                continue
            got[msg.src] = (payload, inner)
        return got

    def collect_next(self, expected: dict[str, int], deadline: float | None):
        """(sender, payload, raw) of the first push of a sender's expected round (MixedSync), or None
        at the deadline; other rounds are kept (later) or refused (earlier), as in ``collect``.  A
        JOIN (from a member, or from a ``joinable`` outsider) is returned at once."""
        for src, round_ in expected.items():
            if (round_, src) in self.early:
                return (src, *self.early.pop((round_, src)))
        while True:
            msg = yield Recv((self.topic,), deadline)
            if msg is None:
                return None
            outsider = msg.src not in expected and msg.src in self.joinable
            opened = self._decoded(msg, self.joinable if outsider else expected)
            if opened is None:
                continue
            payload, inner = opened
            if payload.kind in (BEAT, JOIN):
                if self.site_of.get(msg.src) != self.site:
                    self.result.wan_received += len(msg.data)
                if payload.kind == JOIN and self.joinable:
                    return msg.src, payload, inner
                continue
            if outsider:
                self._refuse(msg, "unknown_sender")   # not a member (yet): its pushes are not used
                continue
            want = expected[msg.src]
            if payload.round < want or (payload.round, msg.src) in self.early:
                self._refuse(msg, "stale" if payload.round < want else "duplicate")
                continue
            if self.site_of.get(msg.src) != self.site:
                self.result.wan_received += len(msg.data)
            if payload.round > want:
                self.early[(payload.round, msg.src)] = (payload, inner)
                continue
            return msg.src, payload, inner


def sent_across(result: GeoResult, site_of: dict[str, str], site: str, dst: str, nbytes: int,
                init: bool = False) -> None:
    if site_of.get(dst) != site:
        if init:
            result.wan_init += nbytes
        else:
            result.wan_sent += nbytes
