"""A worker's local work in mode ps: its batches, the initial model, evaluation (one SGD iteration is
core.ml.train.sgd_iteration, which a worker process runs too).

Batches are a stream per worker: each epoch a permutation of its partition drawn from
(seed, rank, epoch), cut into batches of ``ps.batch_size`` (the last, partial one
kept), so the k-th iteration of a worker trains on the same samples in emu and real.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dtemu.core.ml.batches import epoch_order
from dtemu.core.ml.evaluation import accuracy_and_loss
from dtemu.core.ml.params import flatten
from dtemu.core.ml.task import CLASSIFICATION, Task


class BatchStream:
    def __init__(self, indices: np.ndarray, batch_size: int, seed: int, rank: int):
        self.indices = np.asarray(indices, dtype=np.int64)
        self.batch_size = batch_size
        self.seed, self.rank = seed, rank
        self.epoch, self.pos = 0, 0
        self._order = self._permute()

    def _permute(self) -> np.ndarray:
        return epoch_order(self.indices, (self.seed, self.rank), self.epoch)

    @property
    def per_epoch(self) -> int:
        """Iterations in one epoch of this worker's data."""
        return max(1, -(-len(self.indices) // self.batch_size))

    def next(self) -> np.ndarray:
        if self.pos >= len(self._order):
            self.epoch, self.pos = self.epoch + 1, 0
            self._order = self._permute()
        batch = self._order[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return batch


def xavier_weights(model: nn.Module, seed: int) -> np.ndarray:
    """Algorithm 2's w^0 = Xavier(f): Xavier-uniform weights of every conv and linear layer,
    zero biases, from ``seed``; other layers keep their own initialisation.  Drawn on the CPU, so that
    a model on a GPU starts from the same weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
                drawn = torch.empty(module.weight.shape, dtype=module.weight.dtype)
                module.weight.copy_(nn.init.xavier_uniform_(drawn, generator=gen))
                if module.bias is not None:
                    module.bias.zero_()
    return flatten(model)


def evaluate_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000,
                  task: Task = CLASSIFICATION) -> tuple[float, float]:
    """(accuracy, mean loss) on (x, y) (core.ml.evaluation); the model left in train mode."""
    out = accuracy_and_loss(model, x, y, batch_size, task=task)
    model.train()
    return out
