"""The batch plan, with its seeding convention written once: which samples a party visits in
which order.

A party's samples are its part of the training set (core.ml.data.partition, from the scenario's
seed).  Each epoch it visits them in the order ``epoch_order`` draws from ``stream`` and the
epoch's number: the stream is (the scenario's seed, the party's index) for ddp workers, ps
workers and geo workers, so the k-th batch of a party is the same in emu and for real; an FL
client's training draws from (the round's seed for that client) alone, since every round is a
fresh command with a seed of its own (core.ml.workload.train_job).  A step's own draws (dropout)
come from ``step_seed`` of (the scenario's seed, the party, its step) for ddp, geo and ps, and of
(the command's seed, the client) for an FL client's round.
"""

from __future__ import annotations

import numpy as np


def epoch_order(indices: np.ndarray, stream, epoch: int) -> np.ndarray:
    """``indices`` in the order of epoch ``epoch``: a permutation drawn from ``[*stream, epoch]``."""
    return indices[np.random.default_rng([*stream, epoch]).permutation(len(indices))]


def step_seed(*key: int) -> int:
    """The seed of one step's (or one FL client's round's) own draws: dropout's torch RNG."""
    return int(np.random.SeedSequence(list(key)).generate_state(1)[0])
