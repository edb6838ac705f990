"""The parameter server's decisions, one method each (in the manner of Flower's strategies).

``Strategy`` answers, for a synchronous algorithm: who trains this round
(``configure_round``), how many updates close it early (``quorum``), how the
updates make the next model (``aggregate``), and after the round what it learnt
(``observe_round``: TiFL's latencies); for an asynchronous one: how one update
changes the model (``apply``).  The worker's side (how many local iterations a
round has) is ``local_iterations``.
"""

from __future__ import annotations

import numpy as np

from dtemu.core.fl.staleness import compensated, mix, staleness_factor
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


class Strategy:
    """Synchronous, every worker, all of them close the round, weighted by n_k (Eq. 13-14)."""

    def __init__(self, ps: PSSpec, ranks: list[int], samples: dict[int, int], seed: int):
        self.ps = ps
        self.ranks = ranks
        self.samples = samples  # n_k
        self.seed = seed

    def configure_round(self, version: int) -> tuple[int, ...]:
        """The ranks that train on model ``version`` (all of them: an empty tuple)."""
        return ()

    def quorum(self, expected: int) -> int:
        """Updates that close the round before its deadline."""
        return expected

    def aggregate(self, weights: np.ndarray, updates: list[Update]) -> np.ndarray:
        """w + epsilon * sum_k (n_k / n) delta_k over the updates in (in rank order, so the
        arrival order does not change a bit)."""
        updates = sorted(updates, key=lambda u: u.worker)
        n = float(sum(self.samples[u.worker] for u in updates))
        total = np.zeros_like(weights, dtype=np.float64)
        for u in updates:
            total += (self.samples[u.worker] / n) * u.delta.astype(np.float64)
        return (weights.astype(np.float64) + self.ps.global_lr * total).astype(np.float32)

    def observe_round(self, version: int, arrivals: dict[int, float]) -> None:
        """What the round showed: each rank's time from the round's start to its update."""

    def apply(self, weights: np.ndarray, update: Update, staleness: int, base: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{self.ps.algorithm} is synchronous")


class FedDrop(Strategy):
    """Aggregate as soon as K - K_hat updates are in; the rest arrive late and are dropped."""

    def quorum(self, expected: int) -> int:
        return max(1, expected - self.ps.feddrop_k_hat)


class TiFL(Strategy):
    """Tiers by latency, measured in the first round (everyone trains); each later round picks a
    tier by its probability among those with credits left, then ``tifl_workers_per_round`` of its
    workers at random (from the seed and the version)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.tiers: list[list[int]] = []
        self.credits = list(self.ps.tifl_credits)

    def configure_round(self, version: int) -> tuple[int, ...]:
        if not self.tiers:
            return ()
        rng = np.random.default_rng([self.seed, 0x71F1, version])
        probs = np.array(self.ps.tifl_tier_probs or [1.0] * len(self.tiers), dtype=float)
        if self.credits:
            probs *= np.array([c > 0 for c in self.credits], dtype=float)
        if probs.sum() <= 0:  # every tier spent its credits: all tiers again
            probs = np.ones(len(self.tiers))
        tier = int(rng.choice(len(self.tiers), p=probs / probs.sum()))
        if self.credits:
            self.credits[tier] -= 1
        members = self.tiers[tier]
        pick = rng.choice(len(members), size=min(self.ps.tifl_workers_per_round, len(members)), replace=False)
        return tuple(sorted(members[i] for i in pick))

    def observe_round(self, version: int, arrivals: dict[int, float]) -> None:
        if self.tiers or not arrivals:
            return
        # Fastest first; a rank that did not answer is the slowest of all.
        order = sorted(self.ranks, key=lambda k: (arrivals.get(k, float("inf")), k))
        sizes = np.array_split(np.arange(len(order)), self.ps.tifl_tiers)
        self.tiers = [[order[i] for i in part] for part in sizes]


class Asynchronous(Strategy):
    """ASGD: the server adds each update as it comes: w + epsilon * delta_k."""

    def apply(self, weights, update, staleness, base):
        return (weights + self.ps.global_lr * update.delta).astype(np.float32)


class DCASGD(Asynchronous):
    """DC-ASGD: the gradient g = -delta / eta, compensated for the model having moved since the
    worker's copy: g + lambda * g * g * (w - w_backup); then w - epsilon * eta * g'."""

    def apply(self, weights, update, staleness, base):
        eta = self.ps.lr
        g = -update.delta / eta
        g = compensated(g, self.ps.dcasgd_lambda, weights, base)
        return (weights - self.ps.global_lr * eta * g).astype(np.float32)


class FedAsync(Asynchronous):
    """FedAsync: w = (1 - a_t) w + a_t w_k, a_t = alpha * s(staleness) (constant, poly, hinge)."""

    def mixing(self, staleness: int) -> float:
        ps = self.ps
        return ps.fedasync_alpha * staleness_factor(ps.staleness, staleness, ps.poly_a, ps.hinge_a, ps.hinge_b)

    def apply(self, weights, update, staleness, base):
        return mix(weights, base + update.delta, self.mixing(staleness))


STRATEGIES = {"esync": Strategy, "ssgd": Strategy, "fedavg": Strategy, "feddrop": FedDrop, "tifl": TiFL,
              "asgd": Asynchronous, "dcasgd": DCASGD, "fedasync": FedAsync}


def make_strategy(ps: PSSpec, ranks: list[int], samples: dict[int, int], seed: int) -> Strategy:
    return STRATEGIES[ps.algorithm](ps, ranks, samples, seed)
