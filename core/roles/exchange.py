"""How a data-parallel worker exchanges one step's gradients (ddp_comm_hooks style).

An exchange has four small steps, so the worker can time each one alone:
``compress`` (gradients -> payload), ``send`` (this rank's payload out),
``wait`` (until every rank's payload is in: the pure network wait) and
``apply`` (average, optimizer step).  ``sent`` holds the bytes this rank put
on the wire during the step.
"""

from __future__ import annotations

import numpy as np
import torch

from ..collectives import Collective, mean_in_rank_order


def _flat_grads(params) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in params]).numpy()


def _set_grads(params, flat: np.ndarray) -> None:
    offset = 0
    src = torch.from_numpy(flat)
    for p in params:
        n = p.numel()
        p.grad.copy_(src[offset : offset + n].view_as(p))
        offset += n


class DenseExchange:
    """The baseline: dense gradients, allreduce (gather or ring), momentum SGD."""

    def __init__(self, scenario, model, rank: int, world: int):
        d = scenario.ddp
        self.params = list(model.parameters())
        self.algorithm = d.allreduce
        self.opt = torch.optim.SGD(self.params, lr=d.lr, momentum=d.momentum, nesterov=d.nesterov,
                                   weight_decay=d.weight_decay)
        self.sent = 0
        self._handle = None
        self._mean: np.ndarray | None = None
        self._flat: np.ndarray | None = None

    def density(self, step: int) -> float:
        return 1.0

    def compress(self, step: int) -> bytes:
        self._flat = _flat_grads(self.params)
        return self._flat.tobytes()

    def send(self, coll: Collective, step: int, payload: bytes):
        self.sent = 0
        if self.algorithm == "gather":
            self._handle = yield from coll.start_allgather(step, "dense", payload)
            self.sent = self._handle.bytes_sent
        return self.sent

    def wait(self, coll: Collective, step: int, deadline: float):
        if self.algorithm == "gather":
            yield from coll.wait(self._handle, deadline, what="allreduce")
        else:  # a ring interleaves sending and receiving: all of it counts as waiting
            self._mean, sent = yield from coll.allreduce_mean(step, self._flat, deadline, algorithm="ring")
            self.sent += sent

    def apply(self, coll: Collective, step: int) -> None:
        mean = mean_in_rank_order(coll.collect(self._handle)) if self.algorithm == "gather" else self._mean
        _set_grads(self.params, mean)
        self.opt.step()


def make_exchange(scenario, model, rank: int, world: int, steps_per_epoch: int):
    if scenario.ddp.compression == "dgc":
        from .dgc_exchange import DGCExchange

        return DGCExchange(scenario, model, rank, world, steps_per_epoch)
    return DenseExchange(scenario, model, rank, world)
