"""The evaluator, written once: accuracy (and, where asked, the mean cross-entropy) of a model on
a test set, in eval mode without gradients, in batches of EVAL_BATCH.  A shard of the test set
is a slice of it (core.ml.workload.evaluate_shard: every world-th sample; core.ml.jobs.EvalJob:
whole batches), so the parts' counts add up to the whole's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EVAL_BATCH = 1000


def tally(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = EVAL_BATCH,
          with_loss: bool = False) -> tuple[int, int, float]:
    """(correct, total, summed cross-entropy: 0.0 unless ``with_loss``); the model's mode is restored."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.int64)
    loss = 0.0
    try:
        with torch.no_grad():
            for start in range(0, len(x), batch_size):
                out = model(x[start:start + batch_size])
                target = y[start:start + batch_size]
                if with_loss:
                    loss += float(F.cross_entropy(out, target, reduction="sum"))
                correct += (out.argmax(dim=1) == target).sum()
    finally:
        model.train(was_training)
    return int(correct), len(x), loss


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = EVAL_BATCH) -> tuple[int, int]:
    """(correct, total) of argmax predictions."""
    correct, total, _ = tally(model, x, y, batch_size)
    return correct, total


def accuracy_and_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      batch_size: int = EVAL_BATCH) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on (x, y)."""
    correct, total, loss = tally(model, x, y, batch_size, with_loss=True)
    return correct / max(total, 1), loss / max(total, 1)
