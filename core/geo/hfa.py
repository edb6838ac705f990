"""HFA (``geo.sync: hfa``): hierarchical model averaging, GeoMX's third synchronisation mode.

A worker takes ``geo.k1`` local SGD steps (its own optimizer, momentum kept) and pushes its
weights to its site's PS, which averages them; ``geo.k2`` such local syncs make one global round,
whose last local average goes to the global PS instead, which averages the sites and sends the
result down (and to the master).  So a worker computes k1·k2 batches per round, the LAN carries
k2 averages per round and the WAN one.  Every worker ends a round with the global average, so the
models agree after the last round.  Sync ids: local sync j of round r is (r-1)·k2 + j; the
global sync of round r is r·k2.  Losses are handled as in FSA (a PS goes on without a silent
child; a worker whose PS is gone stops), and so is joining (``geo.joining``, core.geo.join): a
site is let in when a global round closes, with that round's average, and starts the next one;
a worker whose PS started again takes the average it forwards and goes on from the next round.
"""

from __future__ import annotations

import numpy as np
import torch

from dtemu.core import events as ev
from dtemu.core.geo import join
from dtemu.core.geo.common import round_batch, set_lr
from dtemu.core.wire.topics import GEO_PULL, GEO_PUSH
from dtemu.core.ml.params import load_params, params_vector
from dtemu.core.geo.payload import STATE, encode_dense
from dtemu.core.geo.spec import GLOBAL_PS, MASTER
from dtemu.core.ml.jobs import gradient_pass
from dtemu.core.ml.task import failed_gradients


def first_round(state_round: int, g) -> int:
    """The global round a worker or local PS starts with, given the pull it started from: the
    initial model (sync 0), or the STATE of a running run after sync ``round`` × ``k2``."""
    return state_round // g.k2 + 1


def worker(b, index: int, up: str, pulls, start: int = 1):
    g, ctx, work = b.g, b.ctx, b.work
    opt = torch.optim.SGD(b.model.parameters(), lr=g.lr, momentum=g.momentum)
    r = start - 1
    while (r := r + 1) <= g.rounds:
        set_lr(opt, g.lr_at(r))   # a step schedule counts global rounds
        step = (r - 1) * g.k1 * g.k2   # the batches of a worker that was there from the start
        for j in range(1, g.k2 + 1):
            sync = (r - 1) * g.k2 + j
            t0 = ctx.now()
            loss = 0.0
            for _ in range(g.k1):
                step += 1
                batch = round_batch(work, b.s, index, step)
                try:
                    loss = yield from gradient_pass(work, b.model, batch, index, step)
                except Exception as err:  # the task's own code raised: a zero step, the run goes on
                    loss = failed_gradients(ctx, work, b.model, err, step)
                opt.step()
            t1 = ctx.now()
            data = encode_dense(sync, params_vector(b.model), g.fp16)
            yield from b.send(GEO_PUSH, data, up)
            got = yield from pulls.collect([up], sync, b.pull_deadline())
            if not got:
                b.gave_up(sync, [up])
                return
            if got[up][0].kind == STATE:   # its PS started again and joined anew: the run's model
                r = first_round(join.resume(b, None, got[up][0], sync), g) - 1   # weights only
                b.result.rounds = r
                break
            load_params(b.model, got[up][0].dense())
            t2 = ctx.now()
            b.result.comm_s.append(t2 - t1)
            ctx.emit(ev.GEO_STEP, round=sync, loss=round(loss, 6), compute_s=round(t1 - t0, 9),
                     comm_s=round(t2 - t1, 9), bytes_sent=len(data))
        else:
            b.result.rounds = r


def local_ps(b, workers: list[str], pushes, pulls, start: int = 1):
    g, ctx = b.g, b.ctx
    for r in range(start, g.rounds + 1):
        for j in range(1, g.k2 + 1):
            sync = (r - 1) * g.k2 + j
            t0 = ctx.now()
            got = yield from pushes.collect(workers, sync, b.deadline())
            if len(got) < len(workers):
                b.gave_up(sync, [w for w in workers if w not in got], going_on=bool(got))
                if not got:
                    return
                workers = [w for w in workers if w in got]
            total = np.zeros(b.dim, np.float32)
            for w in workers:
                total += got[w][0].dense()
            avg = encode_dense(sync, total / np.float32(len(workers)), g.fp16)
            if j < g.k2:
                out = avg
            else:
                t1 = ctx.now()
                yield from b.send(GEO_PUSH, avg, GLOBAL_PS)
                down = yield from pulls.collect([GLOBAL_PS], sync, b.pull_deadline())
                if not down:
                    b.gave_up(sync, [GLOBAL_PS])
                    return
                out = down[GLOBAL_PS][1]
                ctx.emit(ev.GEO_ROUND, round=r, role="local_ps", wait_s=round(t1 - t0, 9),
                         wan_s=round(ctx.now() - t1, 9), bytes_up=len(avg), bytes_down=len(out))
            for w in workers:
                yield from b.send(GEO_PULL, out, w)
        b.result.rounds = r


def global_ps(b, children: list[str], pushes, every_child: list[str] | None = None):
    """``every_child``: with ``geo.joining``, the sites that may join (core.geo.join): a JOIN is let
    in when the round closes, with the average just sent as its STATE."""
    g, ctx = b.g, b.ctx
    for r in range(1, g.rounds + 1):
        sync = r * g.k2
        t0 = ctx.now()
        got, children = yield from b.gather(pushes, children, r, sync)
        if not got:
            return
        total = np.zeros(b.dim, np.float32)
        for c in children:   # equal sites: the mean of the site averages is the mean over workers
            total += got[c][0].dense()
        out = encode_dense(sync, total / np.float32(len(children)), g.fp16)
        load_params(b.model, total / np.float32(len(children)))
        t1 = ctx.now()
        for dst in [*children, MASTER]:
            yield from b.send(GEO_PULL, out, dst)
        b.result.rounds = r
        ctx.emit(ev.GEO_ROUND, round=r, role="global_ps", wait_s=round(t1 - t0, 9), wan_s=round(ctx.now() - t1, 9),
                 bytes_up=sum(len(got[c][1]) for c in children), bytes_down=len(out))
        if every_child is not None and pushes.news.joins:
            children = yield from join.admit(b, every_child, children, pushes.news, r, None, state_round=sync)
