"""MixedSync (``geo.sync: mixed``): synchronous inside a site, asynchronous between sites.

The local PSs and workers run FSA's loops (core.geo.roles); here is the global PS, which keeps the
model, applies each site's mean gradient as it comes (DC-ASGD against the weights having moved
since that site pulled, ``geo.dcasgd_lambda``) and answers that site alone with the new weights,
and the master with them.  Sites keep no common round, so a JOIN is let in at once.
"""

from __future__ import annotations

from dtemu.core import events as ev
from dtemu.core.geo import join
from dtemu.core.geo.common import Applier, mixed_apply
from dtemu.core.wire.topics import GEO_PULL
from dtemu.core.geo.payload import JOIN, decode, encode_dense, encode_end, encode_state
from dtemu.core.geo.spec import MASTER, worker_sites
from dtemu.core.ml.params import params_vector


def nominal_updates(scenario) -> int:
    """Updates a MixedSync run makes when every site runs all its rounds: one per site and round."""
    return scenario.geo.rounds * len(worker_sites(scenario.network.sites, scenario.network.central))


def global_ps(b, children: list[str], pushes, applier: Applier, every_child: list[str] | None):
    """MixedSync at the global PS: each site's push is applied as it comes (DC-ASGD compensates
    for the weights having moved since that site pulled) and answered with the new weights, and
    with them the master.  A site silent for ``geo.round_timeout_s`` is reported and left out.
    With ``geo.joining`` (``every_child``) a JOIN is let in at once (``_join``).  When the
    master was sent fewer updates than the nominal rounds × sites, an END tells it so."""
    g, ctx = b.g, b.ctx
    expected = {c: 1 for c in children}          # the next round of each site
    pulled = {c: params_vector(b.model) for c in children}   # what each site last received
    fresh: set[str] = set()   # let in and not heard from since: a JOIN from it again is a duplicate
    version = 0
    while expected:
        got = yield from pushes.collect_next(expected, b.deadline())
        if got is None:
            b.gave_up(version, sorted(expected), going_on=True)
            break
        child, payload, raw = got
        if payload.kind == JOIN:
            if every_child is not None and child in every_child and child not in fresh:
                fresh.add(child)
                yield from _join(b, child, expected, pulled, version)
            continue
        fresh.discard(child)
        t0 = ctx.now()
        w = yield from b.cpu("apply", b.vec_bytes, lambda: mixed_apply(applier, b.model, payload.dense(),
                                                                        pulled[child], g.dcasgd_lambda,
                                                                        payload.round))
        version += 1
        # the site's round, and the master's version
        out, to_master = yield from b.cpu("encode", 2 * b.vec_bytes, lambda: (
            encode_dense(payload.round, w, g.fp16), encode_dense(version, w, g.fp16)))
        pulled[child] = decode(out, b.dim).dense()
        yield from b.send(GEO_PULL, out, child)
        yield from b.send(GEO_PULL, to_master, MASTER)
        ctx.emit(ev.GEO_ROUND, round=version, role="global_ps", wait_s=0.0, wan_s=round(ctx.now() - t0, 9),
                 bytes_up=len(raw), bytes_down=len(out))
        expected[child] += 1
        if expected[child] > g.rounds:
            del expected[child]
    b.result.rounds = version
    if version < nominal_updates(b.s):
        yield from b.send(GEO_PULL, encode_end(b.dim, version), MASTER)
    return b.finish(params_vector(b.model))


def _join(b, child: str, expected: dict[str, int], pulled: dict, version: int):
    """A site's JOIN in MixedSync, let in at once with the global weights as they are.  A newcomer
    (or a site back after it was lost) runs the rounds the slowest member has left, so the run
    ends about when it would have; a member whose local PS started again skips the round its
    old life was in (its push died with it: an asynchronous run goes on without that update)."""
    # (the global PS's loop runs while some site is expected, so ``expected`` is not empty)
    state_round = expected[child] if child in expected else min(expected.values()) - 1
    expected[child] = state_round + 1
    if expected[child] > b.g.rounds:
        del expected[child]
    w = params_vector(b.model)
    pulled[child] = w
    yield from join.admit_one(b, child, encode_state(state_round, w), version)
