"""Local training and evaluation loops, shared by emulated and real clients.

The data are preloaded tensors indexed directly (``x[idx]``): a DataLoader
costs more per step than a small model's forward and backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dtemu.core.ml.batches import epoch_order
from dtemu.core.ml.params import device_of, flatten
from dtemu.core.ml.sgd import SGD
from dtemu.core.ml.task import CLASSIFICATION, Task


@dataclass(frozen=True)
class TrainResult:
    steps: int  # optimizer steps taken
    samples: int  # samples processed, counting each epoch
    mean_loss: float  # per-sample mean training loss over all steps (0.0 if none)


def steps_with_torch_optim(scenario) -> bool:
    """Do the scenario's training nodes step with torch.optim (the roles of ddp, ps and geo), rather
    than with core.ml.sgd (an FL client's ``train_local``, the training handed out as jobs)?"""
    return scenario.kind.steps_with_torch_optim


def warm_up() -> None:
    """Pay torch's one-off costs now: the first torch.optim optimizer imports torch._dynamo (1.1 s
    here, 1-4 s on a busy machine), which would otherwise land in a real rank's first round against
    its timeout (the roles of ddp, ps and geo use torch.optim; an FL client's ``train_local`` does not)."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def train_local(model: nn.Module, x: torch.Tensor, y: torch.Tensor, indices, *,
                epochs: int, batch_size: int, lr: float, momentum: float = 0.0,
                weight_decay: float = 0.0, seed: int, proximal_mu: float = 0.0,
                task: Task = CLASSIFICATION) -> TrainResult:
    """SGD on ``x[indices], y[indices]`` for whole epochs, in place (``LocalTraining``'s steps, all
    at once).

    A fresh optimizer each call: momentum does not carry over rounds, as in FedAvg.  The same
    inputs give a bit-identical model, and the caller's RNG state is untouched.
    """
    if epochs < 0 or batch_size < 1:
        raise ValueError(f"need epochs >= 0 and batch_size >= 1, got {epochs}, {batch_size}")
    training = LocalTraining(model, x, y, indices, batch_size=batch_size, lr=lr, momentum=momentum,
                             weight_decay=weight_decay, seed=seed, proximal_mu=proximal_mu, task=task)
    training.run(epochs * training.per_epoch)
    return training.result()


class LocalTraining:
    """A client's SGD on ``x[indices], y[indices]``, a batch at a time, for as many steps as its caller
    asks (``run``), in ``model`` itself: an FL round's whole epochs at once (``train_local``), or
    ESync's iterations one by one, a question to the state server between two (core.fl.esync).

    Mini-batches follow an order shuffled from (seed, epoch), epoch after epoch; the last partial
    batch of an epoch is kept.  Dropout draws from a torch RNG seeded with ``seed`` inside
    fork_rng, and its state is kept between calls: n calls of one step give the bits of one call
    of n steps, whatever other models trained in between.

    ``proximal_mu`` > 0 (FedProx, Li et al. 2020): the loss gains μ/2 · ||w − w₀||², w₀ the
    weights training starts from (the global model), so each gradient gains μ · (w − w₀).  It is
    added to the gradient rather than built into the loss: the same value, no autograd graph
    over every parameter, and at μ = 0 not one operation more.

    ``task`` (core.ml.task) gives the loss (cross-entropy unless the scenario names its own) and may
    bring its optimizer (else SGD with the settings above).
    """

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, indices, *, batch_size: int,
                 lr: float, momentum: float = 0.0, weight_decay: float = 0.0, seed: int,
                 proximal_mu: float = 0.0, task: Task = CLASSIFICATION):
        if batch_size < 1:
            raise ValueError(f"need batch_size >= 1, got {batch_size}")
        self.model, self.x, self.y, self.task = model, x, y, task
        self.indices = np.asarray(indices, dtype=np.int64)
        self.batch_size, self.seed, self.mu = batch_size, seed, proximal_mu
        self.params = list(model.parameters())
        device = device_of(self.params)
        # core.ml.sgd.SGD: torch's CPU bits without dynamo's import; a GPU's step is torch.optim's
        make = task.optimizer or (SGD if device.type == "cpu" else torch.optim.SGD)
        self.opt = make(self.params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        self.anchor = [p.detach().clone() for p in self.params] if proximal_mu else None
        self.steps = self.samples = 0
        # A GPU's own RNG (dropout there draws from it) is forked and kept as the CPU's is.
        self._gpus = gpus_of(model)
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # a tensor: no sync per step
        self._rng: tuple | None = None     # dropout's RNG between calls (None: seed it)
        self._epoch, self._order, self._pos = -1, None, 0

    @property
    def per_epoch(self) -> int:
        """Steps in one epoch (a partial last batch is one)."""
        return -(-len(self.indices) // self.batch_size)

    @property
    def next_batch(self) -> int:
        """How many samples the next step trains on."""
        n = len(self.indices)
        left = n - self._pos if self._order is not None and self._pos < n else n
        return min(self.batch_size, left)

    def run(self, steps: int) -> None:
        """``steps`` more steps (none on an empty partition)."""
        if steps <= 0 or not len(self.indices):
            return
        self.model.train()
        with torch.random.fork_rng(devices=self._gpus), torch.enable_grad():
            if self._rng is None:
                torch.manual_seed(self.seed)   # (every device's RNG)
            else:
                torch.set_rng_state(self._rng[0])
                for gpu, state in zip(self._gpus, self._rng[1:]):
                    torch.cuda.set_rng_state(state, gpu)
            for _ in range(steps):
                self._step()
            self._rng = (torch.get_rng_state(), *(torch.cuda.get_rng_state(gpu) for gpu in self._gpus))

    def _step(self) -> None:
        if self._order is None or self._pos >= len(self.indices):
            self._epoch, self._pos = self._epoch + 1, 0
            self._order = torch.from_numpy(epoch_order(self.indices, (self.seed,), self._epoch))
        idx = self._order[self._pos:self._pos + self.batch_size]
        self._pos += self.batch_size
        self.opt.zero_grad()
        loss = self.task.loss(self.model(self.x[idx]), self.y[idx])
        loss.backward()
        if self.anchor is not None:
            _add_proximal(self.params, self.anchor, self.mu)
        self.opt.step()
        self.loss_sum += loss.detach() * len(idx)
        self.steps += 1
        self.samples += len(idx)

    def weights(self) -> np.ndarray:
        """The model's weights now, flat (float32)."""
        return flatten(self.model)

    def result(self) -> TrainResult:
        return TrainResult(self.steps, self.samples, float(self.loss_sum) / self.samples if self.samples else 0.0)


def gpus_of(model: nn.Module) -> list[int]:
    """The GPU ``model`` is on, as ``fork_rng(devices=...)`` takes it ([] on the CPU): dropout there draws
    from the GPU's own RNG, which a step seeds and must leave as it found it, as the CPU's."""
    device = device_of(model.parameters())
    return [device.index or 0] if device.type == "cuda" else []


@torch.no_grad()
def _add_proximal(params, anchor, mu: float) -> None:
    """grad += μ · (w − w₀): the gradient of FedProx's μ/2 · ||w − w₀||²."""
    for p, p0 in zip(params, anchor):
        if p.grad is not None:
            p.grad.add_(p - p0, alpha=mu)


def compute_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, idx, *, seed: int,
                      task: Task = CLASSIFICATION) -> float:
    """One forward and backward pass on ``x[idx]``: fills every ``p.grad``, returns the loss.

    The data-parallel worker's compute step; the optimizer step comes after
    the gradients were exchanged.  Dropout draws from ``seed`` (see train_local).
    """
    model.train()
    model.zero_grad(set_to_none=False)
    idx = torch.as_tensor(idx)
    with torch.random.fork_rng(devices=gpus_of(model)), torch.enable_grad():
        torch.manual_seed(seed)
        loss = task.loss(model(x[idx]), y[idx])
        loss.backward()
    return float(loss.detach())
