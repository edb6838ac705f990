"""The batch plan, with its seeding convention written once: which samples a party visits in
which order.

A party's samples are its part of the training set (core.ml.data.partition, from the scenario's
seed).  Each epoch it visits them in the order ``epoch_order`` draws from ``stream`` and the
epoch's number: the stream is (the scenario's seed, the party's index) for ddp workers, ps
workers and geo workers, so the k-th batch of a party is the same in emu and for real; an FL
client's training draws from (the round's seed for that client) alone, since every round is a
fresh command with a seed of its own (core.ml.workload.train_job).
"""

from __future__ import annotations

import numpy as np


def epoch_order(indices: np.ndarray, stream, epoch: int) -> np.ndarray:
    """``indices`` in the order of epoch ``epoch``: a permutation drawn from ``[*stream, epoch]``."""
    return indices[np.random.default_rng([*stream, epoch]).permutation(len(indices))]
