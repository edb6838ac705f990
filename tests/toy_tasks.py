"""Small tasks for tests of core.ml.task: a next-token model (integer inputs, a target per token,
core.ml.task.SequenceTask's loss and counting) and an image classification at another shape with the default loss."""

from __future__ import annotations

import torch
from torch import nn

from dtemu.core.ml.task import SequenceTask

VOCAB, LENGTH = 8, 6


class _NextToken(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.out = nn.Linear(16, VOCAB)

    def forward(self, x):  # (N, T) token ids -> (N, T, VOCAB) logits
        return self.out(torch.tanh(self.embed(x)))


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, LENGTH), generator=torch.Generator().manual_seed(seed))


class NextToken(SequenceTask):
    """Predict (token + 1) mod VOCAB at every position: learnable in a few steps."""

    train_s_per_sample = 2e-5  # emu's modelled cost (SmallColour has none: its scenarios set one)

    def model(self):
        return _NextToken()

    def data(self):
        x_train, x_test = _tokens(256, 1), _tokens(64, 2)
        return x_train, (x_train + 1) % VOCAB, x_test, (x_test + 1) % VOCAB


class SmallColour:
    """3x12x12 images, 4 classes (the class is the brightest channel): the default loss and counting."""

    def model(self):
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 12 * 12, 4))

    def data(self):
        g = torch.Generator().manual_seed(3)
        x = torch.rand(300, 3, 12, 12, generator=g)
        y = torch.randint(0, 4, (300,), generator=g)
        x[torch.arange(300), y % 3] += 1.0
        return x[:240], y[:240] % 3, x[240:], y[240:] % 3


class NoModel:
    def data(self):
        return NextToken().data()


class FailingData(NextToken):
    def data(self):
        raise SystemExit("no data today")


class WrongData(NextToken):
    def data(self):
        return "not a data set"


class Flaky(NextToken):
    """Its loss raises on some batches (those whose targets sum to a multiple of 5): bad task code."""

    def loss(self, output, target):
        if int(target.sum()) % 5 == 0:
            raise ValueError("this batch is not to my liking")
        return super().loss(output, target)


class WithAdam(NextToken):
    """NextToken trained with Adam at the scenario's learning rate: a task's own optimizer."""

    made = 0  # optimizers made in this process (the tests run the clients here)

    def optimizer(self, params, lr, momentum, weight_decay):
        WithAdam.made += 1
        return torch.optim.Adam(params, lr=lr)
