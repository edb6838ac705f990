"""The evaluator, written once: accuracy (and, where asked, the mean loss) of a model on
a test set, in eval mode without gradients, in batches of EVAL_BATCH.  A shard of the test set
is a slice of it (core.ml.workload.evaluate_shard: every world-th sample; core.ml.jobs.EvalJob:
whole batches), so the parts' counts add up to the whole's.  What counts as right and the loss are
the task's (core.ml.task: argmax and cross-entropy unless the scenario names its own)."""

from __future__ import annotations

import torch
from torch import nn

from dtemu.core.ml.task import CLASSIFICATION, Task

EVAL_BATCH = 1000


def tally(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = EVAL_BATCH,
          with_loss: bool = False, task: Task = CLASSIFICATION) -> tuple[int, int, float]:
    """(correct, counted, summed loss: 0.0 unless ``with_loss``); the model's mode is restored."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=x.device)   # (counted where the model runs)
    counted = 0
    loss = 0.0
    try:
        with torch.no_grad():
            for start in range(0, len(x), batch_size):
                out = model(x[start:start + batch_size])
                target = y[start:start + batch_size]
                if with_loss:
                    loss += float(task.loss_sum(out, target))
                right, n = task.correct(out, target)
                correct += right
                counted += n
    finally:
        model.train(was_training)
    return int(correct), counted, loss


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = EVAL_BATCH,
             task: Task = CLASSIFICATION) -> tuple[int, int]:
    """(correct, counted) of the model's predictions."""
    correct, total, _ = tally(model, x, y, batch_size, task=task)
    return correct, total


def accuracy_and_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      batch_size: int = EVAL_BATCH, task: Task = CLASSIFICATION) -> tuple[float, float]:
    """(accuracy, mean loss per counted prediction) on (x, y)."""
    correct, total, loss = tally(model, x, y, batch_size, with_loss=True, task=task)
    return correct / max(total, 1), loss / max(total, 1)
