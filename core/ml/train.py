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
    """SGD on ``x[indices], y[indices]`` for whole epochs, in place.

    Mini-batches follow an order shuffled from (seed, epoch); the last partial
    batch is kept.  A fresh optimizer each call: momentum does not carry over
    rounds, as in FedAvg.  Dropout draws from a torch RNG seeded with ``seed``
    inside fork_rng, so the same inputs give a bit-identical model and the
    caller's RNG state is untouched.

    ``proximal_mu`` > 0 (FedProx, Li et al. 2020): the loss gains μ/2 · ||w − w₀||², w₀ the
    weights the call starts from (the global model), so each gradient gains μ · (w − w₀).  It is
    added to the gradient rather than built into the loss: the same value, no autograd graph
    over every parameter, and at μ = 0 not one operation more.

    ``task`` (core.ml.task) gives the loss (cross-entropy unless the scenario names its own) and may
    bring its optimizer (else SGD with the settings above).
    """
    if epochs < 0 or batch_size < 1:
        raise ValueError(f"need epochs >= 0 and batch_size >= 1, got {epochs}, {batch_size}")
    indices = np.asarray(indices, dtype=np.int64)
    n = len(indices)
    params = list(model.parameters())
    make = task.optimizer or SGD  # SGD: torch's bits, no dynamo
    opt = make(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    anchor = [p.detach().clone() for p in params] if proximal_mu else None
    model.train()
    steps = 0
    loss_sum = torch.zeros((), dtype=torch.float64)  # summed as a tensor: no sync per step
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        for epoch in range(epochs):
            order = torch.from_numpy(epoch_order(indices, (seed,), epoch))
            for start in range(0, n, batch_size):
                idx = order[start:start + batch_size]
                opt.zero_grad()
                loss = task.loss(model(x[idx]), y[idx])
                loss.backward()
                if anchor is not None:
                    _add_proximal(params, anchor, proximal_mu)
                opt.step()
                loss_sum += loss.detach() * len(idx)
                steps += 1
    samples = epochs * n
    return TrainResult(steps, samples, float(loss_sum) / samples if samples else 0.0)


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
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(seed)
        loss = task.loss(model(x[idx]), y[idx])
        loss.backward()
    return float(loss.detach())
