"""The one strategy interface of a federation, asked by FL's controller (core.fl.controller and
core.fl.fedasync): one method per decision, in the manner of Flower's Strategy.

- ``configure_round(key, candidates)``: who trains this round, of the ``candidates`` who could
  (None: whoever the run would ask anyway); ``key`` seeds any draw;
- ``quorum(expected)``: updates that close a round before its deadline;
- ``aggregate(weights, updates)``: a synchronous round's updates -> the next model;
- ``observe_round(key, arrivals)``: what the round showed (each one's time to answer);
- ``apply(weights, delta, staleness, base)``: one update of an asynchronous rule -> the next model;
- ``state()`` / ``restore(state)``: what a checkpoint keeps.

The decisions that rules share are written once, here and in core.fl.staleness: FedDrop's quorum
(``drop_quorum``), TiFL's tiers (``Tiers``), and the asynchronous rules (``ASGD``, ``DCASGD``,
``FedAsync``) over plain numbers, built from ``fl.*`` (core.fl.rules).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.staleness import compensated, mix, staleness_factor


# fl keys that belong to one rule (key -> the fl.algorithm it is for): refused under another
# (core.modes.fl), and left out of the digest under another (core.scenario).
RULE_KEYS = {"feddrop": "feddrop", "tifl": "tifl", "dcasgd_lambda": "dcasgd", "esync": "esync"}


class Strategy:
    asynchronous = False   # True: updates are applied one at a time (``apply``), no rounds
    selects = False        # True: ``configure_round`` chooses (the caller then finds the candidates)

    def configure_round(self, key: int, candidates: Sequence[Hashable]) -> tuple | None:
        return None

    def quorum(self, expected: int) -> int:
        return expected

    def aggregate(self, weights: np.ndarray, updates: list) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} applies one update at a time")

    def observe_round(self, key: int, arrivals: dict) -> None:
        pass

    def apply(self, weights: np.ndarray, delta: np.ndarray, staleness: int, base: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} is synchronous")

    def describe(self, staleness: int) -> str:
        """How an asynchronous update of ``staleness`` was weighed, for the event log ("" if plainly)."""
        return ""

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        pass


# --- synchronous rules' parts --------------------------------------------------------
def drop_quorum(expected: int, k_hat: int) -> int:
    """FedDrop: the round closes once all but ``k_hat`` of the ``expected`` updates are in; the
    rest come late and are dropped."""
    return max(1, expected - k_hat)


class Tiers:
    """TiFL's selection: tiers by latency, measured in the first round observed (everyone asked
    trains); each later round picks a tier by its probability among those with credits left and
    someone among the candidates (a client available), then ``per_round`` of its members among
    the candidates, at random from (seed, the round's key)."""

    _STREAM = 0x71F1

    def __init__(self, everyone: Sequence[Hashable], tiers: int, probs: Sequence[float],
                 credits: Sequence[int], per_round: int, seed: int):
        self.everyone, self.count, self.probs = list(everyone), tiers, list(probs)
        self.credits, self.per_round, self.seed = list(credits), per_round, seed
        self.tiers: list[list] = []

    def pick(self, key: int, candidates: Sequence[Hashable]) -> tuple | None:
        if not self.tiers:
            return None
        rng = np.random.default_rng([self.seed, self._STREAM, key])
        probs = np.array(self.probs or [1.0] * len(self.tiers), dtype=float)
        if self.credits:
            probs *= np.array([c > 0 for c in self.credits], dtype=float)
        if probs.sum() <= 0:  # every tier spent its credits: all tiers again
            probs = np.ones(len(self.tiers))
        here = set(candidates)
        probs *= np.array([any(m in here for m in tier) for tier in self.tiers], dtype=float)
        if probs.sum() <= 0:  # no tier has anyone there: no one to ask this round
            return ()
        tier = int(rng.choice(len(self.tiers), p=probs / probs.sum()))
        if self.credits:
            self.credits[tier] -= 1
        members = [m for m in self.tiers[tier] if m in here]
        pick = rng.choice(len(members), size=min(self.per_round, len(members)), replace=False)
        return tuple(sorted(members[i] for i in pick))

    def observe(self, arrivals: dict) -> None:
        if self.tiers or not arrivals:
            return
        # Fastest first; one that did not answer is the slowest of all.
        order = sorted(self.everyone, key=lambda k: (arrivals.get(k, float("inf")), k))
        sizes = np.array_split(np.arange(len(order)), self.count)
        self.tiers = [[order[i] for i in part] for part in sizes]

    # --- a checkpoint keeps the tiers and the credits left (as numbers: each one's tier) -----
    def state(self) -> dict[str, np.ndarray]:
        if not self.tiers:
            return {}
        tier_of = {m: t for t, members in enumerate(self.tiers) for m in members}
        out = {"tifl_tier": np.array([tier_of.get(m, -1) for m in self.everyone], np.float64)}
        if self.credits:
            out["tifl_credits"] = np.array(self.credits, np.float64)
        return out

    def restore(self, state: dict[str, np.ndarray]) -> None:
        if "tifl_tier" not in state:
            return
        tier_of = [int(t) for t in state["tifl_tier"]]
        self.tiers = [[m for m, t in zip(self.everyone, tier_of) if t == k] for k in range(self.count)]
        if "tifl_credits" in state:
            self.credits = [int(c) for c in state["tifl_credits"]]


class ChoosesByTier:
    """TiFL's part of a strategy: its ``tiers`` (a ``Tiers``) choose each
    round's clients, learn from the first round, and travel in the checkpoint."""

    selects = True
    tiers: Tiers

    def configure_round(self, key, candidates):
        return self.tiers.pick(key, candidates)

    def observe_round(self, key, arrivals):
        self.tiers.observe(arrivals)

    def state(self):
        return self.tiers.state()

    def restore(self, state):
        self.tiers.restore(state)


def check_tiers(keys: tuple[str, str, str], tiers: int, probs, credits, members: int, who: str) -> None:
    """TiFL's keys (``keys``: the paths of tiers, tier_probs, credits) against ``members`` ``who``;
    ScenarioError with the key's path."""
    tiers_key, probs_key, credits_key = keys
    if tiers > members:
        raise ScenarioError(tiers_key, f"{tiers} tiers for {members} {who}")
    for key, values in ((probs_key, probs), (credits_key, credits)):
        if values and len(values) != tiers:
            raise ScenarioError(key, f"expected {tiers} values ({tiers_key}), got {len(values)}")
    for i, p in enumerate(probs):
        if not 0 <= p <= 1:
            raise ScenarioError(f"{probs_key}[{i}]", f"expected a probability, got {p!r}")
    if probs and sum(probs) <= 0:
        raise ScenarioError(probs_key, "at least one tier must have a chance")
    for i, c in enumerate(credits):
        if c < 0:
            raise ScenarioError(f"{credits_key}[{i}]", f"expected a count >= 0, got {c}")


# --- asynchronous rules ----------------------------------------------------------------
class ASGD(Strategy):
    """The server adds each update as it comes: w + ε·Δ."""

    asynchronous = True

    def __init__(self, lr: float):
        self.lr = lr

    def apply(self, weights, delta, staleness, base):
        return (weights + self.lr * delta).astype(np.float32)


class DCASGD(ASGD):
    """DC-ASGD: the gradient g = −Δ/η, compensated for the model having moved since the client's
    copy (core.fl.staleness.compensated); then w − ε·η·g'."""

    def __init__(self, lr: float, eta: float, lam: float):
        super().__init__(lr)
        self.eta, self.lam = eta, lam

    def apply(self, weights, delta, staleness, base):
        g = compensated(-delta / self.eta, self.lam, weights, base)
        return (weights - self.lr * self.eta * g).astype(np.float32)


class FedAsync(ASGD):
    """FedAsync: w ← (1 − a)·w + a·(w_τ + Δ), a = α·s(staleness) (core.fl.staleness)."""

    def __init__(self, alpha: float, function: str, poly_a: float, hinge_a: float, hinge_b: float):
        super().__init__(1.0)
        self.alpha, self.function = alpha, function
        self.poly_a, self.hinge_a, self.hinge_b = poly_a, hinge_a, hinge_b

    def mixing(self, staleness: int) -> float:
        return self.alpha * staleness_factor(self.function, staleness, self.poly_a, self.hinge_a, self.hinge_b)

    def apply(self, weights, delta, staleness, base):
        return mix(weights, base + delta, self.mixing(staleness))

    def describe(self, staleness: int) -> str:
        return f", mixed at {self.mixing(staleness):.4g}"
