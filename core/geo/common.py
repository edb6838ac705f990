"""What every geo role shares: its result, applying what comes down, the round's data, the tally
of bytes that crossed the WAN, and what the parameter servers compute on a round's payloads (a
site's share of the sum, the root's sum, the global PS's step: each one op of
core.runtime.compute.CPU_OPS that the roles hand to ``_Base.cpu``, so that emu can time it when
the scenario prices it).  (Receiving a round: core.geo.receiver; the model as a flat
vector of its parameters: core.ml.params.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from dtemu.core.fl.staleness import compensated
from dtemu.core.geo.payload import Payload, encode_dense
from dtemu.core.ml.batches import epoch_order
from dtemu.core.ml.params import load_params, params_vector

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


class Applier:
    """Turns what comes down (an aggregated gradient, or weights) into the model; the same
    on every worker and on the master, so their models stay bit-identical.  ``lr_at`` gives a
    round's learning rate (``GeoSpec.lr_at``): a step schedule changes it between rounds, and
    torch's SGD keeps its momentum buffer in gradient units, so the new rate applies at once."""

    def __init__(self, model, lr_at: Callable[[int], float], momentum: float, weights_mode: bool):
        self.model, self.weights_mode, self.lr_at = model, weights_mode, lr_at
        self.opt = torch.optim.SGD(list(model.parameters()), lr=lr_at(1), momentum=momentum)

    def apply(self, vec: np.ndarray, round_: int) -> None:
        if self.weights_mode:
            load_params(self.model, vec)
            return
        src = torch.from_numpy(np.array(vec, dtype=np.float32))
        off = 0
        for p in self.model.parameters():
            p.grad = src[off:off + p.numel()].view_as(p).to(p.device, copy=True)
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


def sent_across(result: GeoResult, site_of: dict[str, str], site: str, dst: str, nbytes: int,
                init: bool = False) -> None:
    if site_of.get(dst) != site:
        if init:
            result.wan_init += nbytes
        else:
            result.wan_sent += nbytes


# --- the parameter servers' sums and steps
def site_share(got: dict, workers: list[str], dim: int, workers_total: int, site_size: int,
               sync: str) -> np.ndarray:
    """A local PS's sum of its workers' gradients, as the share it pushes to the global PS."""
    total = np.zeros(dim, np.float32)
    for w in workers:   # in a fixed order: arrival order changes no bit
        total += got[w][0].dense()
    if sync == "mixed":   # the site's mean gradient: the global PS applies each site's as it comes
        return total / np.float32(len(workers))
    share = total / np.float32(workers_total)   # the site's part of the mean over every worker
    if len(workers) < site_size:
        share *= np.float32(site_size / len(workers))
    return share


def root_sum(got: dict, children: list[str], dim: int, hips: bool, present: int, workers_total: int) -> np.ndarray:
    """The global (or flat) PS's dense sum of a round's pushes, as the mean over every worker."""
    total = np.zeros(dim, np.float32)
    for c in children:
        total += got[c][0].dense()
    if not hips:  # the flat PS has every worker's gradient: it takes the mean itself
        total /= np.float32(present)
    elif present < workers_total:  # each site sent its part of the mean over every worker
        total *= np.float32(workers_total / present)
    return total


def applied(applier: Applier, model, update: np.ndarray, round_: int) -> np.ndarray:
    """The global PS's model after round ``round_``'s ``update`` (geo.global_optimizer: weights go down)."""
    applier.apply(update, round_)
    return params_vector(model)


def mixed_apply(applier: Applier, model, grad: np.ndarray, pulled: np.ndarray, dcasgd_lambda: float,
                round_: int) -> np.ndarray:
    """MixedSync's global step: a site's gradient of its round ``round_`` (DC-ASGD: g + lambda
    g*g*(w_now - w_when_pulled)) applied at that round's learning rate; the weights after it."""
    if dcasgd_lambda > 0:
        grad = compensated(grad, dcasgd_lambda, params_vector(model), pulled)
    applier.apply(grad, round_)
    return params_vector(model)
