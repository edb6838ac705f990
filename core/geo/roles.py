"""The geo roles (``mode: geo``), written once for both runtimes: master, worker, local PS,
global PS and the flat-PS baseline.  FSA (synchronous inside and between sites) is here;
MixedSync's global PS (it answers each site as its push comes, DC-ASGD optional) is in
``core.geo.mixed``, HFA's loops in ``core.geo.hfa``.

One round, HiPS (``geo.architecture: hips``)::

    worker   --grad (dense, fp16 under FP16)-->  local PS      (LAN)
    local PS --site sum / W (dense, or BiSparse (index, value))--> global PS   (WAN)
    global PS --sum (dense, or sparse summed by index)--> every local PS (WAN) and the master (LAN)
    local PS --aggregate (dense)--> its workers                                 (LAN)

Workers never talk across the WAN.  The flat baseline (``flat``): every worker pushes to one
PS in the central site and pulls from it, across the WAN.  What comes down is the aggregated
gradient, which every worker and the master apply with the same SGD, so their models stay
identical; with ``geo.global_optimizer`` the global PS keeps the model and sends weights.

The roles' CPU work outside the gradient (encoding a push, a PS's sum, BiSparse's sparsifying
and merging, making a sparse aggregate dense, applying the update) is a ``Compute`` of its op
(core.runtime.compute.CPU_OPS) on the model's size when the scenario prices it
(``compute.cpu``, emu only); when it does not, it is done in place, as it always was, so that
absent costs change no event.  HFA's loops (core.geo.hfa) are not priced.

Before round 1 the master sends the initial model down the same tree (fp32, counted apart
from the rounds' traffic).  Every wait has a deadline: a PS waits ``geo.round_timeout_s`` for its
children's pushes, then reports the silent ones (``geo_lost``) and goes on without them (a lost
site or worker never hangs the others); a pull waits longer, so that the level above
can wait out its own timeout first (``TIMEOUTS``).  With ``geo.heartbeat_s`` local PSs beat to
the global PS while they wait, and a site silent for three beats is given up at once.  A worker
whose PS is gone, or a PS whose global PS is gone, stops and says so.
"""

from __future__ import annotations

import numpy as np

from dtemu.core import events as ev
from dtemu.core.geo import hfa, join, mixed
from dtemu.core.geo.bisparse import ResidualSparsifier, whole_blocks
from dtemu.core.geo.common import (Applier, GeoResult, applied, root_sum, round_batch, sent_across, site_downlink,
                                   site_share, worker_optimizer_momentum)
from dtemu.core.wire.topics import GEO_PULL, GEO_PUSH
from dtemu.core.geo.payload import (STATE, decode, encode_beat, encode_blocks, encode_dense, encode_join, encode_sparse,
                                    sum_sparse)
from dtemu.core.geo.spec import FLAT_PS, GLOBAL_PS, MASTER, site_ps, site_workers, worker_sites
from dtemu.core.geo.receiver import Beat, Receiver
from dtemu.core.ml.params import grads_vector, load_params, params_vector, sha256_of
from dtemu.core.runtime.requests import Compute, Send, WaitPeers, cpu_work
from dtemu.core.ml.jobs import gradient_pass
from dtemu.core.ml.task import failed_gradients


# (pushes, pull): how many round timeouts each role waits.  The waits nest, so that a level
# above a lost node times out and goes on before the levels below give it up: a local PS waits
# 1 for its workers, the global PS 2 for the local PSs (one of which may be waiting out a lost
# worker), a local PS 3 for its pull, a worker 5 (its PS may wait 1, then 3).
TIMEOUTS = {"worker": (1, 5), "local_ps": (1, 3), "global_ps": (2, 0), "flat_ps": (1, 0), "master": (1, 3)}


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
        self.vec_bytes = 4 * self.dim   # the model as fp32: what compute.cpu's rates are per MB of
        self.cpu_costs = scenario.compute_for(name).cpu
        self.result = GeoResult(role=role, site=self.site)
        self.workers_total = len(scenario.training_nodes)
        ctx.emit(ev.GEO_START, role=role, site=self.site, dim=self.dim, architecture=self.g.architecture,
                 compression=self.g.compression, authenticated=ctx.sealed)

    def send(self, topic: str, data: bytes, to: str, init: bool = False):
        sealed = self.ctx.seal(topic, 0, data)   # (the identity without a key)
        yield Send(topic, sealed, to=to)
        sent_across(self.result, self.site_of, self.site, to, len(sealed), init)

    def cpu(self, op: str, nbytes: int, fn):
        """``fn()``: CPU work ``op`` on ``nbytes``, timed by emu where the scenario prices it."""
        return (yield from cpu_work(self.cpu_costs, op, nbytes, fn))

    def receiver(self, topic: str) -> Receiver:
        return Receiver(self.ctx, topic, self.dim, self.site_of, self.site, self.result)

    def deadline(self) -> float:
        """For a round's pushes from the level below."""
        return self.ctx.now() + TIMEOUTS[self.result.role][0] * self.g.round_timeout_s

    def pull_deadline(self) -> float:
        """For the level above, which may itself wait out a timeout on a lost child and go on."""
        return self.ctx.now() + TIMEOUTS[self.result.role][1] * self.g.round_timeout_s

    def gave_up(self, round_: int, missing: list[str], going_on: bool = False, reason: str = "timeout"):
        """Nothing from ``missing`` within the round's timeout: report it; unless the role goes on
        without them (a PS whose other children answered), it stops here."""
        self.result.lost = sorted(set(self.result.lost) | set(missing))
        self.ctx.emit(ev.GEO_LOST, round=round_, missing=sorted(missing),
                      reason=f"{reason}, going on without" if going_on else f"{reason}, stopping")
        if not going_on:
            self.result.stop_reason = f"round {round_}: no payload from {', '.join(sorted(missing))} " \
                                      f"within {self.g.round_timeout_s:g} s"

    def gather(self, pushes: Receiver, children: list[str], round_: int, sync: int):
        """The global PS's round: the children's pushes numbered ``sync``, and the children still in
        the run.  One that said JOIN started again: it is not lost but let in anew when the round
        closes (core.geo.join); the others missing are reported, and the run goes on without them
        if anyone answered."""
        got = yield from pushes.collect(children, sync, self.deadline())
        if len(got) < len(children):
            if lost := [c for c in children if c not in got and c not in pushes.news.joins]:
                self.gave_up(round_, lost, going_on=bool(got), reason=pushes.news.loss_reason)
            children = [c for c in children if c in got]
        return got, children

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
    weights = params_vector(b.model)
    yield from b.send(GEO_PUSH, encode_dense(0, weights), b.root, init=True)
    applier = Applier(b.model, g.lr_at, worker_optimizer_momentum(g), g.weights_down)
    pulls = b.receiver(GEO_PULL)
    # MixedSync: one pull per global update, every site's rounds in turn.
    last = mixed.nominal_updates(scenario) if g.sync == "mixed" else g.rounds
    for r in range(1, last + 1):
        got = yield from pulls.collect([b.root], r * g.k2 if g.sync == "hfa" else r, b.pull_deadline())
        if not got:
            if pulls.news.end is not None:   # MixedSync: fewer updates than nominal (a site lost, or late)
                break
            b.gave_up(r, [b.root], going_on=g.sync == "mixed" and r > 1)
            break
        payload, raw = got[b.root]
        if b.hips and not g.weights_down:  # what a local PS hands its workers, so that the master's model is theirs
            payload = yield from b.cpu("densify", b.vec_bytes if payload.sparse else 0,
                                       lambda: decode(site_downlink(payload, raw, g.fp16), b.dim))
        yield from b.cpu("apply", b.vec_bytes, lambda: applier.apply(payload.dense(), r))
        b.result.rounds = r
        if r % g.eval_every == 0 or r == last:
            yield from _evaluate(b, r)
    if b.result.rounds and b.result.rounds % g.eval_every and b.result.rounds != last:
        yield from _evaluate(b, b.result.rounds)   # the run ended early: the model it ended with
    return b.finish(params_vector(b.model))


def _evaluate(b: _Base, round_: int):
    correct, total = yield Compute(lambda: b.work.evaluate_shard(b.model, 0, 1), samples=b.work.test_size,
                                   kind="eval")
    accuracy = correct / total
    b.result.final_accuracy = accuracy
    b.result.history.append((b.ctx.now(), accuracy))
    b.ctx.emit(ev.EVAL, round=round_, accuracy=accuracy)


def worker(ctx, scenario, work, name: str):
    b = _Base(ctx, scenario, work, name, "worker")
    g = b.g
    index = scenario.training_nodes.index(name)
    up = site_ps(b.site) if b.hips else FLAT_PS
    pulls = b.receiver(GEO_PULL)
    pulls.news.state_ok = g.joining   # the initial model, or (a site that joins) the model of a running run
    got = yield from pulls.collect([up], 0, b.pull_deadline() if g.joining else b.deadline(), count_wan=False)
    pulls.news.state_ok = False
    if not got:
        b.gave_up(0, [up])
        return b.finish(params_vector(b.model))
    first = got[up][0]
    load_params(b.model, first.dense())
    pulls.news.restarts = up if g.joining else None   # its PS may start again and forward the run's model
    if g.sync == "hfa":
        yield from hfa.worker(b, index, up, pulls, hfa.first_round(first.round, g))
        return b.finish(params_vector(b.model))
    applier = Applier(b.model, g.lr_at, worker_optimizer_momentum(g), g.weights_down)
    if first.momentum is not None:
        join.set_momentum(applier, first.momentum)
    r = first.round
    while (r := r + 1) <= g.rounds:
        batch = round_batch(work, scenario, index, r)
        t0 = ctx.now()
        try:
            loss = yield from gradient_pass(work, b.model, batch, index, r)
        except Exception as err:  # the task's own code raised: this round's push is zero, the run goes on
            loss = failed_gradients(ctx, work, b.model, err, r)
        t1 = ctx.now()
        data = yield from b.cpu("encode", b.vec_bytes, lambda: encode_dense(r, grads_vector(b.model.parameters()), g.fp16))
        yield from b.send(GEO_PUSH, data, up)
        got = yield from pulls.collect([up], r, b.pull_deadline())
        if not got:
            b.gave_up(r, [up])
            break
        if got[up][0].kind == STATE:   # its PS started again: the run's model replaces this round's pull
            r = join.resume(b, applier, got[up][0], r)
            continue
        yield from b.cpu("apply", b.vec_bytes, lambda: applier.apply(got[up][0].dense(), r))
        t2 = ctx.now()
        b.result.rounds = r
        b.result.comm_s.append(t2 - t1)
        ctx.emit(ev.GEO_STEP, round=r, loss=round(loss, 6), compute_s=round(t1 - t0, 9),
                 comm_s=round(t2 - t1, 9), bytes_sent=len(data))
    return b.finish(params_vector(b.model))


def local_ps(ctx, scenario, work, name: str):
    """A site's PS: sums its workers' gradients, pushes the site's share to the global PS
    (BiSparse: its top entries, the rest kept as residual), forwards the aggregate down."""
    b = _Base(ctx, scenario, work, name, "local_ps")
    g = b.g
    workers = site_workers(b.site, g)
    pushes, pulls = b.receiver(GEO_PUSH), b.receiver(GEO_PULL)
    if g.heartbeat_s is not None:   # while it waits, the global PS hears that the site is alive
        pushes.beat = pulls.beat = Beat(lambda: b.send(GEO_PUSH, encode_beat(b.dim), GLOBAL_PS), g.heartbeat_s)
    if g.joining:   # its first message says it is up (core.geo.join): counted from the start, or let in later
        # Over DDS a rank that comes up late must first see the global PS's reader, or its JOIN
        # is written to no one; emu's global PS is up and this takes no time.
        yield WaitPeers((GLOBAL_PS,), b.pull_deadline())
        yield from b.send(GEO_PUSH, encode_join(b.dim), GLOBAL_PS, init=True)
    pulls.news.state_ok = g.joining
    got = yield from pulls.collect([GLOBAL_PS], 0, b.pull_deadline() if g.joining else b.deadline(),
                                   count_wan=False)
    pulls.news.state_ok = False
    if not got:
        b.gave_up(0, [GLOBAL_PS])
        return b.finish()
    first_round = got[GLOBAL_PS][0].round + 1   # 1, or after the round a joining site got the model of
    for w in workers:
        yield from b.send(GEO_PULL, got[GLOBAL_PS][1], w, init=True)
    if g.sync == "hfa":
        yield from hfa.local_ps(b, workers, pushes, pulls, hfa.first_round(got[GLOBAL_PS][0].round, g))
        return b.finish()
    sparsifier = None
    if g.sparse:
        site_index = worker_sites(scenario.network.sites, scenario.network.central).index(b.site)
        sparsifier = ResidualSparsifier(b.sizes, g.density, g.sample_ratio, g.residual_momentum,
                                        scenario.seed, site_index, g.dense_below,
                                        g.momentum_masking, half_whole=g.fp16)
    site_size = len(workers)
    for r in range(first_round, g.rounds + 1):
        t0 = ctx.now()
        got = yield from pushes.collect(workers, r, b.deadline())
        if len(got) < len(workers):
            b.gave_up(r, [w for w in workers if w not in got], going_on=bool(got))
            if not got:
                break
            workers = [w for w in workers if w in got]   # the site goes on without them
        share = yield from b.cpu("sum", b.vec_bytes * len(workers),
                                 lambda: site_share(got, workers, b.dim, b.workers_total, site_size, g.sync))
        if sparsifier is not None:
            data = yield from b.cpu("sparsify", b.vec_bytes,
                                    lambda: _encode_bisparse(r, b.dim, sparsifier.blocks,
                                                             *sparsifier.compress(share, r, g.density_at(r)), g.fp16))
        else:
            data = yield from b.cpu("encode", b.vec_bytes, lambda: encode_dense(r, share, g.fp16))
        t1 = ctx.now()
        yield from b.send(GEO_PUSH, data, GLOBAL_PS)
        down = yield from pulls.collect([GLOBAL_PS], r, b.pull_deadline())
        if not down:
            b.gave_up(r, [GLOBAL_PS])
            break
        t2 = ctx.now()
        out = yield from b.cpu("densify", b.vec_bytes if down[GLOBAL_PS][0].sparse else 0,
                               lambda: site_downlink(*down[GLOBAL_PS], g.fp16))
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
    every_child = list(children)
    pushes = b.receiver(GEO_PUSH)
    # geo.joining: the master's model and every site's JOIN (core.geo.join); a site not up by then may
    # join later.
    joining = b.hips and g.joining
    start = b.deadline() if g.start_wait_s is None or not joining else ctx.now() + g.start_wait_s
    got = yield from pushes.collect([MASTER, *children] if joining else [MASTER], 0, start, count_wan=False)
    if g.heartbeat_s is not None and b.hips:
        pushes.news.watch = g.heartbeat_s
    if MASTER not in got:
        b.gave_up(0, [MASTER])
        return b.finish()
    if joining:
        if late := [c for c in children if c not in got]:
            b.gave_up(0, late, going_on=True, reason="not up at the start")
        children = [c for c in children if c in got]
        pushes.news.joinable = set(every_child)
    init_payload, init_raw = got[MASTER]
    load_params(b.model, init_payload.dense())
    for child in children:
        yield from b.send(GEO_PULL, init_raw, child, init=True)
    applier = Applier(b.model, g.lr_at, g.momentum, False) if g.weights_down else None
    follower = join.Follower(b.model, g) if joining and applier is None and g.sync == "fsa" else None
    if g.sync == "mixed":
        return (yield from mixed.global_ps(b, children, pushes, applier, every_child if joining else None))
    if g.sync == "hfa":
        yield from hfa.global_ps(b, children, pushes, every_child if joining else None)
        return b.finish(params_vector(b.model))
    weight = {c: (g.workers_per_site if b.hips else 1) for c in every_child}   # workers behind each child
    for r in range(1, g.rounds + 1):
        t0 = ctx.now()
        got, children = yield from b.gather(pushes, children, r, r)
        if not got:
            break
        present = sum(weight[c] for c in children)
        t1 = ctx.now()
        if g.sparse:
            out = yield from b.cpu("merge", b.vec_bytes * len(children), lambda: _encode_bisparse(
                r, b.dim, whole_blocks(b.sizes, g.dense_below), *sum_sparse([got[c][0] for c in children], b.dim),
                g.fp16))
        else:
            total = yield from b.cpu("sum", b.vec_bytes * len(children),
                                     lambda: root_sum(got, children, b.dim, b.hips, present, b.workers_total))
            if applier is not None:
                total = yield from b.cpu("apply", b.vec_bytes, lambda: applied(applier, b.model, total, r))
            out = yield from b.cpu("encode", b.vec_bytes, lambda: encode_dense(r, total, g.fp16))
        for dst in [*children, MASTER]:
            yield from b.send(GEO_PULL, out, dst)
        b.result.rounds = r
        ctx.emit(ev.GEO_ROUND, round=r, role=b.result.role, wait_s=round(t1 - t0, 9),
                 wan_s=round(ctx.now() - t1, 9), bytes_up=sum(len(raw) for _, raw in got.values()), bytes_down=len(out))
        if follower is not None:
            follower.follow(out, b.dim, r)
        if joining and pushes.news.joins:   # the round closed: a site that said JOIN gets its model
            children = yield from join.admit(b, every_child, children, pushes.news, r, follower)
    return b.finish(params_vector(b.model) if applier is not None else None)


def _encode_bisparse(round_: int, dim: int, blocks, idx, vals, fp16: bool) -> bytes:
    """BiSparse's WAN payload: the tensors sent whole as dense blocks (half precision under FP16: a
    whole tensor is a dense transfer), the rest as fp32 (index, value) pairs."""
    if blocks:
        return encode_blocks(round_, dim, blocks, idx, vals, fp16)
    return encode_sparse(round_, dim, idx, vals)
