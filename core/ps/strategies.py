"""The parameter server's strategies: the one interface of a federation (core.fl.strategy: who
trains this round, how many updates close it, how they make the next model, what the round
showed, how one update of an asynchronous rule changes the model), with the rules FL's
controller has too built from the same parts (FedDrop's quorum, TiFL's tiers, ASGD, DC-ASGD,
FedAsync).  The worker's side (how many local iterations a round has) is ``local_iterations``.
"""

from __future__ import annotations

import numpy as np

from dtemu.core.fl.strategy import ASGD, DCASGD, ChoosesByTier, FedAsync, Tiers, drop_quorum
from dtemu.core.fl.strategy import Strategy as BaseStrategy
from dtemu.core.ps.messages import Update
from dtemu.core.ps.spec import PSSpec


def local_iterations(ps: PSSpec, per_epoch: int) -> int | None:
    """Local iterations per round for a worker with ``per_epoch`` batches per epoch; None:
    ask the state server after each one (ESync)."""
    if ps.fixed_iterations is not None:
        return ps.fixed_iterations
    if ps.algorithm == "esync":
        return None
    if ps.algorithm in ("ssgd", "asgd", "dcasgd"):
        return 1
    return ps.local_epochs * per_epoch  # fedavg, feddrop, tifl, fedasync


class Strategy(BaseStrategy):
    """Synchronous, every worker, all of them close the round, weighted by n_k (Eq. 13-14)."""

    def __init__(self, ps: PSSpec, ranks: list[int], samples: dict[int, int], seed: int):
        self.ps = ps
        self.ranks = ranks
        self.samples = samples  # n_k
        self.seed = seed

    def aggregate(self, weights: np.ndarray, updates: list[Update]) -> np.ndarray:
        """w + epsilon * sum_k (n_k / n) delta_k over the updates in (in rank order, so the
        arrival order does not change a bit).  (FL's FedAvg, core.fl.aggregate, sums n_k delta_k
        and divides once: the same rule, rounded otherwise; ps keeps the paper's form, and with it
        the models of its scenarios.)"""
        updates = sorted(updates, key=lambda u: u.worker)
        n = float(sum(self.samples[u.worker] for u in updates))
        total = np.zeros_like(weights, dtype=np.float64)
        for u in updates:
            total += (self.samples[u.worker] / n) * u.delta.astype(np.float64)
        return (weights.astype(np.float64) + self.ps.global_lr * total).astype(np.float32)


class FedDrop(Strategy):
    """Aggregate as soon as K - K_hat updates are in; the rest arrive late and are dropped."""

    def quorum(self, expected: int) -> int:
        return drop_quorum(expected, self.ps.feddrop_k_hat)


class TiFL(ChoosesByTier, Strategy):
    """Tiers by latency, measured in the first round (everyone trains); each later round picks a
    tier, then ``tifl_workers_per_round`` of its workers (core.fl.strategy.Tiers)."""

    def __init__(self, *args):
        super().__init__(*args)
        ps = self.ps
        self.tiers = Tiers(self.ranks, ps.tifl_tiers, ps.tifl_tier_probs, ps.tifl_credits,
                           ps.tifl_workers_per_round, self.seed)


SYNCHRONOUS = {"esync": Strategy, "ssgd": Strategy, "fedavg": Strategy, "feddrop": FedDrop, "tifl": TiFL}


def make_strategy(ps: PSSpec, ranks: list[int], samples: dict[int, int], seed: int) -> BaseStrategy:
    """The server's strategy: a synchronous one of this module, or an asynchronous rule, the
    one FL's controller uses too (core.fl.strategy), from the ps keys."""
    if ps.algorithm == "asgd":
        return ASGD(ps.global_lr)
    if ps.algorithm == "dcasgd":
        return DCASGD(ps.global_lr, ps.lr, ps.dcasgd_lambda)
    if ps.algorithm == "fedasync":
        return FedAsync(ps.fedasync_alpha, ps.staleness, ps.poly_a, ps.hinge_a, ps.hinge_b)
    return SYNCHRONOUS[ps.algorithm](ps, ranks, samples, seed)
