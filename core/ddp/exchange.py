"""How a data-parallel worker exchanges one step's gradients (ddp_comm_hooks style).

An exchange has four small steps, so the worker can time each one alone:
``compress`` (gradients -> payload), ``send`` (this rank's payload out),
``wait`` (until every rank's payload is in: the pure network wait) and
``apply`` (average, optimizer step).  ``sent`` holds the bytes this rank put
on the wire during the step.

After a worker is lost (``core/roles/worker.py``) the survivors go on as a new
group: ``regroup(index, size)`` tells the exchange its place among them, and
``state_bytes`` / ``load_state`` carry the optimizer's state (momentum
buffers) from the group's leader to the others, so that every survivor resumes
from the same state.
"""

from __future__ import annotations

from typing import Generator, Protocol

import numpy as np
import torch

from dtemu.core.ddp.collectives import Collective, mean_in_rank_order
from dtemu.core.ddp.optstate import pack_buffers, unpack_buffers
from dtemu.core.ml.params import device_of, grads_vector, load_grads


class Exchange(Protocol):
    """How one step's gradients travel between the workers and become an optimizer step."""

    sent: int  # bytes this rank put on the wire during the step

    def density(self, step: int) -> float:
        """The fraction of the gradient sent at ``step`` (1.0: dense)."""

    def compress(self, step: int) -> bytes:
        """This rank's gradients (already in its parameters' .grad) as a payload."""

    def send(self, coll: Collective, step: int, payload: bytes) -> Generator:
        """Send this rank's payload (role requests); returns the bytes sent."""

    def wait(self, coll: Collective, step: int, deadline: float) -> Generator:
        """Until every member's payload is in (the pure network wait), or CollectiveTimeout."""

    def apply(self, coll: Collective, step: int) -> None:
        """Average what came in and take the optimizer step."""

    def regroup(self, index: int, size: int) -> None:
        """After a loss: this rank's place among ``size`` survivors."""

    def state_bytes(self) -> bytes:
        """The optimizer state the group's leader hands to the survivors."""

    def load_state(self, data: bytes) -> None:
        """Take the leader's ``state_bytes``; checks all of it before it changes anything."""


class DenseExchange:
    """The baseline: dense gradients, allreduce (gather, ring or pipelined), momentum SGD."""

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
        self._flat = grads_vector(self.params)
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
        else:  # a ring or the pipelined allreduce interleaves sending and receiving: all of it counts as waiting
            self._mean, sent = yield from coll.allreduce_mean(step, self._flat, deadline, algorithm=self.algorithm)
            self.sent += sent

    def apply(self, coll: Collective, step: int) -> None:
        mean = mean_in_rank_order(coll.collect(self._handle)) if self.algorithm == "gather" else self._mean
        load_grads(self.params, mean)
        self.opt.step()

    # --- after a loss --------------------------------------------------
    def regroup(self, index: int, size: int) -> None:
        pass  # the collective averages over its members

    def state_bytes(self) -> bytes:
        state = self.opt.state
        return pack_buffers([state[p].get("momentum_buffer") if p in state else None for p in self.params])

    def load_state(self, data: bytes) -> None:
        shapes = [tuple(p.shape) for p in self.params]
        for p, buf in zip(self.params, unpack_buffers(data, shapes, device_of(self.params))):
            if buf is None:
                self.opt.state.pop(p, None)
            else:
                self.opt.state[p]["momentum_buffer"] = buf


