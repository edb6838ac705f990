"""Weighted aggregation of client updates (FedAvg).

FedAvg is a federation strategy (core.fl.strategy: the interface the FL controller and the ps
server ask), and its aggregation is made of one method per step: which order to sum in, how
much each update weighs, what delta an update stands for, and how the mean delta moves the
global model (``step``; a server optimizer steps otherwise, core.fl.server_opt).

Determinism matters more than speed here: the same round run in the emulator
and over the real network must give a bit-identical model, so updates are
summed in client order (never arrival order) and accumulated in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dtemu.core.compression.codecs import Dense, Sparse
from dtemu.core.errors import RejectedUpdate
from dtemu.core.fl.strategy import Strategy

KINDS = ("delta", "weights")


@dataclass
class Update:
    """One client's contribution to a round.

    ``kind`` says what the payload holds: "delta" (w_i - global, dense or
    sparse) or "weights" (the client's full dense weights w_i).
    """

    client: str
    num_samples: int
    kind: str
    payload: Dense | Sparse


def _norm(v: np.ndarray) -> float:
    # float64 so that large float32 entries cannot overflow the sum of squares.
    v64 = v.astype(np.float64, copy=False)
    return math.sqrt(float(np.dot(v64, v64)))


def check_update(
    u: Update,
    dim: int,
    max_norm: float | None = None,
    *,
    base: np.ndarray | None = None,
) -> None:
    """Raise RejectedUpdate if ``u`` must not be aggregated.

    ``max_norm`` bounds the L2 norm of the update's delta.  For a "weights"
    update the delta is w_i - ``base`` (the global weights); without ``base``
    the norm of the weights themselves is bounded.
    """
    who = f"update from {u.client!r}"
    if u.kind not in KINDS:
        raise RejectedUpdate(f"{who}: unknown kind {u.kind!r}")
    if isinstance(u.num_samples, bool) or not isinstance(u.num_samples, (int, np.integer)):
        raise RejectedUpdate(f"{who}: num_samples must be an int, got {u.num_samples!r}")
    if u.num_samples <= 0:
        raise RejectedUpdate(f"{who}: num_samples={u.num_samples} must be positive")
    p = u.payload
    if isinstance(p, Dense):
        if p.values.ndim != 1 or p.dim != dim:
            raise RejectedUpdate(f"{who}: dimension {p.values.shape} but the model has {dim}")
    elif isinstance(p, Sparse):
        if u.kind == "weights":
            raise RejectedUpdate(f"{who}: full weights must be dense")
        if p.dim != dim:
            raise RejectedUpdate(f"{who}: dimension {p.dim} but the model has {dim}")
        if p.indices.ndim != 1 or p.indices.shape != p.values.shape:
            raise RejectedUpdate(f"{who}: {p.indices.shape} indices for {p.values.shape} values")
        if p.indices.size and (p.indices.min() < 0 or p.indices.max() >= dim):
            raise RejectedUpdate(f"{who}: sparse index out of range [0, {dim})")
    else:
        raise RejectedUpdate(f"{who}: payload is {type(p).__name__}, not Dense or Sparse")
    if not p.is_finite():
        raise RejectedUpdate(f"{who}: contains NaN or Inf")
    if max_norm is not None:
        if u.kind == "weights" and base is not None:
            norm = _norm(p.values.astype(np.float64) - base.astype(np.float64, copy=False))
        else:
            norm = _norm(p.values)
        if not norm <= max_norm:
            raise RejectedUpdate(f"{who}: norm {norm:.6g} exceeds bound {max_norm:g}")


class FedAvg(Strategy):
    """new = weights + server_lr · Σ (n_i / N) · delta_i, with N = Σ n_i.

    Rounded as Σ n_i · delta_i, divided by N once at the end: integer weights times float32 values
    are exact in float64.  (Mode ps weighed each delta by its share n_i / N before the sum, ESync's
    Eq. 13 as written; its scenarios, read as FL's now, round as FL does.)
    """

    def __init__(self, server_lr: float = 1.0):
        if not (math.isfinite(server_lr) and server_lr > 0):
            raise ValueError(f"server_lr must be finite and positive, got {server_lr!r}")
        self.server_lr = float(server_lr)

    def order(self, updates: list[Update]) -> list[Update]:
        """Summation order: by client name, so arrival order cannot change a bit."""
        ordered = sorted(updates, key=lambda u: u.client)
        for a, b in zip(ordered, ordered[1:]):
            if a.client == b.client:
                # Two updates from one client have no order we could defend.
                raise ValueError(f"two updates from client {a.client!r} in one round")
        return ordered

    def weight(self, u: Update) -> int:
        """How much an update counts: the number of samples it was trained on."""
        return int(u.num_samples)

    def accumulate(self, acc: np.ndarray, weights: np.ndarray, u: Update, w: float) -> None:
        """Add w · delta_i to the float64 accumulator ``acc``."""
        p = u.payload
        if isinstance(p, Sparse):
            # np.add.at accumulates repeated indices instead of keeping the last.
            np.add.at(acc, p.indices, w * p.values.astype(np.float64))
        elif u.kind == "weights":
            acc += w * (p.values.astype(np.float64) - weights)
        else:
            acc += w * p.values.astype(np.float64)

    def step(self, weights: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        """Move the global model along the mean delta; float32 out."""
        return (weights + self.server_lr * mean_delta).astype(np.float32)

    def aggregate(self, weights: np.ndarray, updates: list[Update]) -> np.ndarray:
        """New global weights (float32) from the current ones and this round's updates.

        Raises ValueError for an empty list (the caller checks quorum first) and
        RejectedUpdate if an update should have been filtered out already.
        """
        if not updates:
            raise ValueError("no updates to aggregate")
        w64 = np.asarray(weights, dtype=np.float64)
        if w64.ndim != 1:
            raise ValueError(f"expected flat weights, got shape {w64.shape}")
        dim = w64.shape[0]
        for u in updates:
            check_update(u, dim)
        ordered = self.order(updates)
        counts = [self.weight(u) for u in ordered]
        total = sum(counts)
        acc = np.zeros(dim, dtype=np.float64)
        for u, n in zip(ordered, counts):
            self.accumulate(acc, w64, u, n)
        acc /= total
        return self.step(w64, acc)
