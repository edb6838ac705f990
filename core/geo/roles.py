"""The geo roles (``mode: geo``), written once for both runtimes: master, worker, local PS,
global PS and the flat-PS baseline.  FSA: synchronous inside and between sites.

One round, HiPS (``geo.architecture: hips``)::

    worker   --grad (dense, fp16 under FP16)-->  local PS      (LAN)
    local PS --site sum / W (dense, or BiSparse (index, value))--> global PS   (WAN)
    global PS --sum (dense, or sparse summed by index)--> every local PS (WAN) and the master (LAN)
    local PS --aggregate (dense)--> its workers                                 (LAN)

Workers never talk across the WAN.  The flat baseline (``flat``): every worker pushes to one
PS in the central site and pulls from it, across the WAN.  What comes down is the aggregated
gradient, which every worker and the master apply with the same SGD, so their models stay
identical; with ``geo.global_optimizer`` the global PS keeps the model and sends weights.

Before round 1 the master sends the initial model down the same tree (fp32, counted apart
from the rounds' traffic).  Every wait has a deadline (``geo.round_timeout_s``): a role whose
round does not complete stops with the missing nodes named, so a lost site ends the run
instead of hanging it.
"""

from __future__ import annotations

import numpy as np

from dtemu.core import events as ev
from dtemu.core.geo.bisparse import ResidualSparsifier
from dtemu.core.geo.common import (GEO_PULL, GEO_PUSH, Applier, GeoResult, Inbox, get_vector, grad_vector,
                                   round_batch, sent_across, set_vector, site_downlink, worker_optimizer_momentum)
from dtemu.core.geo.payload import decode, encode_dense, encode_sparse, sum_sparse
from dtemu.core.geo.spec import FLAT_PS, GLOBAL_PS, MASTER, site_ps, site_workers, worker_sites
from dtemu.core.ml.params import sha256_of
from dtemu.core.runtime.requests import Compute, Send


class _Base:
    """A role's scenario facts, its result and its sending with the WAN tally."""

    def __init__(self, ctx, scenario, work, name: str, role: str):
        self.ctx, self.s, self.g, self.work, self.name = ctx, scenario, scenario.geo, work, name
        self.site_of = scenario.site_of
        self.site = self.site_of[name]
        self.hips = self.g.architecture == "hips"
        self.root = GLOBAL_PS if self.hips else FLAT_PS
        self.model = work.new_model()
        self.sizes = [p.numel() for p in self.model.parameters()]
        self.dim = sum(self.sizes)
        self.result = GeoResult(role=role, site=self.site)
        self.workers_total = len(scenario.training_nodes)
        ctx.emit(ev.GEO_START, role=role, site=self.site, dim=self.dim, architecture=self.g.architecture,
                 compression=self.g.compression)

    def send(self, topic: str, data: bytes, to: str, init: bool = False):
        yield Send(topic, data, to=to)
        sent_across(self.result, self.site_of, self.site, to, len(data), init)

    def inbox(self, topic: str) -> Inbox:
        return Inbox(self.ctx, topic, self.dim, self.site_of, self.site, self.result)

    def deadline(self) -> float:
        return self.ctx.now() + self.g.round_timeout_s

    def gave_up(self, round_: int, missing: list[str]):
        self.result.lost = sorted(missing)
        self.result.stop_reason = f"round {round_}: no payload from {', '.join(sorted(missing))} " \
                                  f"within {self.g.round_timeout_s:g} s"
        self.ctx.emit(ev.GEO_LOST, round=round_, missing=sorted(missing), reason="timeout")

    def finish(self, weights: np.ndarray | None = None) -> GeoResult:
        r = self.result
        r.weights = weights
        extra = {"model_sha256": sha256_of(weights)} if weights is not None else {}
        if r.stop_reason:
            extra["stop_reason"] = r.stop_reason
        self.ctx.emit(ev.GEO_END, role=r.role, rounds=r.rounds, wan_sent=r.wan_sent,
                      wan_received=r.wan_received, rejected=r.rejected, **extra)
        return r


def master(ctx, scenario, work, name: str = MASTER):
    """Initialises the model and sends it down; then follows the aggregate as a worker would and
    evaluates (every ``geo.eval_every`` rounds and after the last)."""
    b = _Base(ctx, scenario, work, name, "master")
    g = b.g
    weights = get_vector(b.model)
    yield from b.send(GEO_PUSH, encode_dense(0, weights), b.root, init=True)
    applier = Applier(b.model, g.lr, worker_optimizer_momentum(g), g.global_optimizer)
    pulls = b.inbox(GEO_PULL)
    for r in range(1, g.rounds + 1):
        got = yield from pulls.collect([b.root], r, b.deadline())
        if not got:
            b.gave_up(r, [b.root])
            break
        payload, raw = got[b.root]
        if b.hips:  # what a local PS hands its workers, so that the master's model is theirs
            payload = decode(site_downlink(payload, raw, g.fp16), b.dim)
        applier.apply(payload.dense())
        b.result.rounds = r
        if r % g.eval_every == 0 or r == g.rounds:
            correct, total = yield Compute(lambda: work.evaluate_shard(b.model, 0, 1),
                                           samples=work.test_size, kind="eval")
            accuracy = correct / total
            b.result.final_accuracy = accuracy
            b.result.history.append((ctx.now(), accuracy))
            ctx.emit(ev.EVAL, round=r, accuracy=accuracy)
    return b.finish(get_vector(b.model))


def worker(ctx, scenario, work, name: str):
    b = _Base(ctx, scenario, work, name, "worker")
    g = b.g
    index = scenario.training_nodes.index(name)
    up = site_ps(b.site) if b.hips else FLAT_PS
    pulls = b.inbox(GEO_PULL)
    got = yield from pulls.collect([up], 0, b.deadline(), count_wan=False)
    if not got:
        b.gave_up(0, [up])
        return b.finish(get_vector(b.model))
    set_vector(b.model, got[up][0].dense())
    applier = Applier(b.model, g.lr, worker_optimizer_momentum(g), g.global_optimizer)
    for r in range(1, g.rounds + 1):
        batch = round_batch(work, scenario, index, r)
        t0 = ctx.now()
        loss = yield Compute(lambda: work.gradients(b.model, batch, index, r), samples=len(batch))
        t1 = ctx.now()
        data = encode_dense(r, grad_vector(b.model), g.fp16)
        yield from b.send(GEO_PUSH, data, up)
        got = yield from pulls.collect([up], r, b.deadline())
        if not got:
            b.gave_up(r, [up])
            break
        applier.apply(got[up][0].dense())
        t2 = ctx.now()
        b.result.rounds = r
        b.result.comm_s.append(t2 - t1)
        ctx.emit(ev.GEO_STEP, round=r, loss=round(loss, 6), compute_s=round(t1 - t0, 9),
                 comm_s=round(t2 - t1, 9), bytes_sent=len(data))
    return b.finish(get_vector(b.model))


def local_ps(ctx, scenario, work, name: str):
    """A site's PS: sums its workers' gradients, pushes the site's share to the global PS
    (BiSparse: its top entries, the rest kept as residual), forwards the aggregate down."""
    b = _Base(ctx, scenario, work, name, "local_ps")
    g = b.g
    workers = site_workers(b.site, g)
    pushes, pulls = b.inbox(GEO_PUSH), b.inbox(GEO_PULL)
    got = yield from pulls.collect([GLOBAL_PS], 0, b.deadline(), count_wan=False)
    if not got:
        b.gave_up(0, [GLOBAL_PS])
        return b.finish()
    for w in workers:
        yield from b.send(GEO_PULL, got[GLOBAL_PS][1], w, init=True)
    sparsifier = None
    if g.sparse:
        site_index = worker_sites(scenario.network.sites, scenario.network.central).index(b.site)
        sparsifier = ResidualSparsifier(b.sizes, g.density, g.sample_ratio, g.residual_momentum,
                                        scenario.seed, site_index)
    for r in range(1, g.rounds + 1):
        t0 = ctx.now()
        got = yield from pushes.collect(workers, r, b.deadline())
        if len(got) < len(workers):
            b.gave_up(r, [w for w in workers if w not in got])
            break
        total = np.zeros(b.dim, np.float32)
        for w in workers:   # in a fixed order: arrival order changes no bit
            total += got[w][0].dense()
        share = total / np.float32(b.workers_total)
        if sparsifier is not None:
            idx, vals = sparsifier.compress(share, r)
            data = encode_sparse(r, b.dim, idx, vals)
        else:
            data = encode_dense(r, share, g.fp16)
        t1 = ctx.now()
        yield from b.send(GEO_PUSH, data, GLOBAL_PS)
        down = yield from pulls.collect([GLOBAL_PS], r, b.deadline())
        if not down:
            b.gave_up(r, [GLOBAL_PS])
            break
        t2 = ctx.now()
        out = site_downlink(*down[GLOBAL_PS], g.fp16)
        for w in workers:
            yield from b.send(GEO_PULL, out, w)
        b.result.rounds = r
        ctx.emit(ev.GEO_ROUND, round=r, role="local_ps", wait_s=round(t1 - t0, 9), wan_s=round(t2 - t1, 9),
                 bytes_up=len(data), bytes_down=len(down[GLOBAL_PS][1]))
    return b.finish()


def root_ps(ctx, scenario, work, name: str):
    """The global PS (HiPS: sums the sites) or the flat PS (sums every worker), in the central site."""
    b = _Base(ctx, scenario, work, name, "global_ps" if name == GLOBAL_PS else "flat_ps")
    g = b.g
    sites = worker_sites(scenario.network.sites, scenario.network.central)
    children = [site_ps(s) for s in sites] if b.hips else list(scenario.training_nodes)
    pushes = b.inbox(GEO_PUSH)
    got = yield from pushes.collect([MASTER], 0, b.deadline(), count_wan=False)
    if not got:
        b.gave_up(0, [MASTER])
        return b.finish()
    init_payload, init_raw = got[MASTER]
    set_vector(b.model, init_payload.dense())
    for child in children:
        yield from b.send(GEO_PULL, init_raw, child, init=True)
    applier = Applier(b.model, g.lr, g.momentum, False) if g.global_optimizer else None
    for r in range(1, g.rounds + 1):
        t0 = ctx.now()
        got = yield from pushes.collect(children, r, b.deadline())
        if len(got) < len(children):
            b.gave_up(r, [c for c in children if c not in got])
            break
        t1 = ctx.now()
        if g.sparse:
            idx, vals = sum_sparse([got[c][0] for c in children], b.dim)
            out = encode_sparse(r, b.dim, idx, vals)
        else:
            total = np.zeros(b.dim, np.float32)
            for c in children:
                total += got[c][0].dense()
            if not b.hips:  # the flat PS has every worker's gradient: it takes the mean itself
                total /= np.float32(b.workers_total)
            if applier is not None:
                applier.apply(total)
                total = get_vector(b.model)
            out = encode_dense(r, total, g.fp16)
        for dst in [*children, MASTER]:
            yield from b.send(GEO_PULL, out, dst)
        b.result.rounds = r
        ctx.emit(ev.GEO_ROUND, round=r, role=b.result.role, wait_s=round(t1 - t0, 9),
                 wan_s=round(ctx.now() - t1, 9), bytes_up=sum(len(got[c][1]) for c in children), bytes_down=len(out))
    return b.finish(get_vector(b.model) if applier is not None else None)
