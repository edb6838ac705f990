"""A character-level language model on a text dtemu generates: the sequence task (``task: char_lm``).

The text is sentences drawn from a small grammar ("the quiet fox follows a red
bird.") from a fixed seed: the same on every host, nothing to download or ship.
Samples are windows of ``LENGTH`` characters; the target is the same window one
character on.  The model embeds each character, runs a one-layer GRU and
predicts the next character at every position; the loss is the cross-entropy
over every position, and a prediction is counted per character.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dtemu.core.ml.task import SequenceTask

LENGTH = 32
ALPHABET = " .abcdefghijklmnopqrstuvwxyz"
VOCAB = len(ALPHABET)
TRAIN_WINDOWS, TEST_WINDOWS = 4096, 512

_WORDS = {
    "det": ["the", "a", "every", "one"],
    "adj": ["quiet", "red", "small", "quick", "old", "bright", "lazy", "green"],
    "noun": ["fox", "bird", "river", "stone", "child", "ship", "tree", "cloud"],
    "verb": ["follows", "sees", "finds", "carries", "watches", "meets", "hides", "leaves"],
}


def text(chars: int, seed: int = 0) -> str:
    """``chars`` characters of sentences from the grammar, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    pick = lambda kind: _WORDS[kind][rng.integers(len(_WORDS[kind]))]  # noqa: E731
    out, n = [], 0
    while n < chars:
        s = f"{pick('det')} {pick('adj')} {pick('noun')} {pick('verb')} {pick('det')} {pick('adj')} {pick('noun')}. "
        out.append(s)
        n += len(s)
    return "".join(out)[:chars]


def windows(chars: str, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` consecutive windows of ``LENGTH`` characters and their targets, as token ids."""
    ids = torch.tensor([ALPHABET.index(c) for c in chars], dtype=torch.int64)
    starts = torch.arange(count) * LENGTH
    index = starts[:, None] + torch.arange(LENGTH)[None, :]
    return ids[index], ids[index + 1]


class CharGRU(nn.Module):
    def __init__(self, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.gru = nn.GRU(32, hidden, batch_first=True)
        self.out = nn.Linear(hidden, VOCAB)

    def forward(self, x):  # (N, T) ids -> (N, T, VOCAB) logits
        hidden, _ = self.gru(self.embed(x))
        return self.out(hidden)


class CharLM(SequenceTask):
    """The built-in sequence task: next-character cross-entropy, counted per character (SequenceTask)."""

    train_s_per_sample = 6.6e-4  # a window, batch 32, 1 thread, AMD EPYC (python -m tools.bench_tasks --task char_lm)

    def model(self):
        return CharGRU()

    def data(self):
        x_train, y_train = windows(text(TRAIN_WINDOWS * LENGTH + 1, seed=0), TRAIN_WINDOWS)
        x_test, y_test = windows(text(TEST_WINDOWS * LENGTH + 1, seed=1), TEST_WINDOWS)
        return x_train, y_train, x_test, y_test
