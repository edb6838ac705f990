"""What every geo role shares: its result, applying what comes down, the round's data, and the
tally of bytes that crossed the WAN.  (Receiving a round: core.geo.receiver; the model as a flat
vector of its parameters: core.ml.params.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from dtemu.core.geo.payload import Payload, encode_dense
from dtemu.core.ml.batches import epoch_order
from dtemu.core.ml.params import load_params

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


def sent_across(result: GeoResult, site_of: dict[str, str], site: str, dst: str, nbytes: int,
                init: bool = False) -> None:
    if site_of.get(dst) != site:
        if init:
            result.wan_init += nbytes
        else:
            result.wan_sent += nbytes
