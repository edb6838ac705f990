"""Sites joining a running geo run (HiPS: FSA, HFA, MixedSync): the global PS's side of it.

Design 004's global scheduler keeps the sites that come and go.  Here the global
PS does it, with three messages:

- every local PS starts by sending the global PS a JOIN (its first message);
- at the start the global PS waits ``geo.start_wait_s`` (default one round
  timeout) for the master's model and every site's JOIN, then starts with the
  sites it heard from; the others are reported (``geo_lost``, "not up at the
  start") and may join later;
- a JOIN during the run (a site that came up late, or came back after it was
  lost, or a member whose local PS started again) is admitted when the round
  in progress closes: the global PS sends that site a STATE, the model after
  that round (weights, and the workers' SGD momentum buffer so that the newcomer
  steps exactly as the others), emits ``geo_join``, and counts the site in the
  next round's quorum.

MixedSync lets a JOIN in at once (core.geo.mixed._join): its sites keep no common
round.  HFA's global PS keeps the average it sends down, and a STATE is those weights (the
workers' own momentum stays theirs: a newcomer's starts at zero), numbered by HFA's
sync ids (``round`` × ``geo.k2``) as its pulls are.

With FSA the global PS sends gradients, not weights (``geo.global_optimizer`` off), so it
keeps a ``Follower``: a copy of the model that applies each round's aggregate
exactly as the workers do (no modelled time), from which a STATE is taken.
"""

from __future__ import annotations

import numpy as np
import torch

from dtemu.core import events as ev
from dtemu.core.geo.common import Applier, site_downlink, worker_optimizer_momentum
from dtemu.core.wire.topics import GEO_PULL
from dtemu.core.geo.inbox import News
from dtemu.core.geo.payload import decode, encode_state
from dtemu.core.ml.params import load_params, params_vector


class Follower:
    """The workers' model at the global PS: what a joining site is brought up to."""

    def __init__(self, model, geo):
        self.geo = geo
        self.applier = Applier(model, geo.lr_at, worker_optimizer_momentum(geo), False)

    def follow(self, out: bytes, dim: int, round_: int) -> None:
        """Apply round ``round_``'s pull as a local PS would hand it to its workers."""
        pull = decode(out, dim)
        self.applier.apply(decode(site_downlink(pull, out, self.geo.fp16), dim).dense(), round_)

    def momentum(self) -> np.ndarray | None:
        bufs = [self.applier.opt.state.get(p, {}).get("momentum_buffer") for p in self.applier.model.parameters()]
        if any(buf is None for buf in bufs):
            return None   # plain SGD, or no round yet
        return torch.cat([buf.reshape(-1) for buf in bufs]).cpu().numpy().astype(np.float32)


def set_momentum(applier: Applier, momentum: np.ndarray) -> None:
    """Give a joining worker's optimizer the others' momentum buffer."""
    src = torch.from_numpy(np.array(momentum, dtype=np.float32))
    off = 0
    for p in applier.model.parameters():
        applier.opt.state[p]["momentum_buffer"] = src[off:off + p.numel()].view_as(p).to(p.device, copy=True)
        off += p.numel()


def resume(b, applier, state, waited: int) -> int:
    """A worker whose local PS started again (and was let in anew) takes the STATE it forwarded in
    place of the pull of ``waited``: the model after ``state.round``; returns that round, the
    worker goes on from the next.  Its push of ``waited`` died with the PS's old life.
    (``applier``: the worker's, for a STATE with momentum; HFA's carry none.)"""
    load_params(b.model, state.dense())
    if state.momentum is not None:
        set_momentum(applier, state.momentum)
    b.result.rounds = state.round
    b.ctx.emit(ev.GEO_REJOIN, round=state.round, waited=waited)
    return state.round


def state_of(b, round_: int, follower: Follower | None) -> bytes:
    """The model a joiner gets after ``round_``: the follower's (weights, momentum), or, with a
    global optimizer, the global PS's own weights (the workers take weights, no momentum)."""
    if follower is None:
        return encode_state(round_, params_vector(b.model))
    return encode_state(round_, params_vector(follower.applier.model), follower.momentum())


def admit(b, every_child: list[str], children: list[str], news: News, round_: int, follower: Follower | None,
          state_round: int | None = None):
    """Let in the sites whose JOIN came (the model of ``round_``, then ``geo_join``); returns the
    members of the next round, in scenario order (the sums' order, so no bit moves).  The STATE
    says ``state_round`` (default ``round_``): HFA numbers its pulls by sync, not by round."""
    joining = [c for c in news.joins if c in every_child]
    news.joins.clear()
    if not joining:
        return children
    state = state_of(b, round_ if state_round is None else state_round, follower)
    for c in joining:
        yield from admit_one(b, c, state, round_)
        news.heard[c] = b.ctx.now()
    return [c for c in every_child if c in children or c in joining]


def admit_one(b, child: str, state: bytes, round_: int):
    """``child`` is in: ``geo_join`` (at the global PS's ``round_``), no longer lost, sent ``state``."""
    b.ctx.emit(ev.GEO_JOIN, round=round_, site=b.site_of[child], ps=child)
    b.result.lost = [n for n in b.result.lost if n != child]
    yield from b.send(GEO_PULL, state, child, init=True)
