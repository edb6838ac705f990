"""The server's update rules beyond FedAvg: FedAdam, FedYogi and FedAdagrad.

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2: the round's weighted
mean delta Δ (FedAvg's, core.fl.aggregate) is a pseudo-gradient for a server optimizer,

    m ← β1·m + (1 − β1)·Δ
    v ← second_moment(v, Δ², β2)          (one small function per rule below)
    x ← x + η · m / (√v + τ)

with m starting at 0 and v at τ² (the paper's v₋₁ ≥ τ²), and no bias correction (the paper
has none; Flower's FedAdam divides η by (1 − β1ᵗ) and multiplies by √(1 − β2ᵗ), so its first
rounds differ).  The state is kept in float64 and travels in the controller's checkpoint, so
a resumed run makes the same model as one that never stopped.
"""

from __future__ import annotations

import numpy as np

from dtemu.core.fl.aggregate import FedAvg


def adagrad_moment(v: np.ndarray, d2: np.ndarray, beta2: float) -> np.ndarray:
    """FedAdagrad: v + Δ² (β2 unused)."""
    return v + d2


def adam_moment(v: np.ndarray, d2: np.ndarray, beta2: float) -> np.ndarray:
    """FedAdam: β2·v + (1 − β2)·Δ²."""
    return beta2 * v + (1 - beta2) * d2


def yogi_moment(v: np.ndarray, d2: np.ndarray, beta2: float) -> np.ndarray:
    """FedYogi: v − (1 − β2)·Δ²·sign(v − Δ²): v grows no faster than Adam's, and shrinks slower."""
    return v - (1 - beta2) * d2 * np.sign(v - d2)


SECOND_MOMENTS = {"fedadagrad": adagrad_moment, "fedadam": adam_moment, "fedyogi": yogi_moment}


class ServerOptimizer(FedAvg):
    """FedAvg's aggregation (order, weights, float64 sums), then an adaptive step on its mean delta."""

    def __init__(self, rule: str, eta: float, beta1: float, beta2: float, tau: float):
        super().__init__()
        self.second_moment = SECOND_MOMENTS[rule]
        self.eta, self.beta1, self.beta2, self.tau = float(eta), float(beta1), float(beta2), float(tau)
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def step(self, weights: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        if self.m is None:
            self.m = np.zeros_like(mean_delta)
            self.v = np.full_like(mean_delta, self.tau * self.tau)
        self.m = self.beta1 * self.m + (1 - self.beta1) * mean_delta
        self.v = self.second_moment(self.v, mean_delta * mean_delta, self.beta2)
        # Yogi's v can reach below 0 only by rounding: √ of it would be NaN, so it is held at 0.
        step = self.m / (np.sqrt(np.maximum(self.v, 0.0)) + self.tau)
        return (weights + self.eta * step).astype(np.float32)

    # --- the state a checkpoint keeps -----------------------------------
    def state(self) -> dict[str, np.ndarray]:
        return {} if self.m is None else {"m": self.m, "v": self.v}

    def restore(self, state: dict[str, np.ndarray]) -> None:
        if state:
            self.m, self.v = state["m"].astype(np.float64), state["v"].astype(np.float64)

