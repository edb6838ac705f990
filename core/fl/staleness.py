"""FedAsync's rule (Xie et al., "Asynchronous Federated Optimization", 2019), written once for the
FL controller (fl.algorithm fedasync) and the parameter server (ps.algorithm fedasync):

    x ← (1 − a)·x + a·x_k,   a = α · s(t − τ)

x_k the model a client trained from version τ, t the server's version now, and s one of

    constant  s = 1
    poly      s = (staleness + 1)^(−a)
    hinge     s = 1 for staleness ≤ b, else 1 / (a·(staleness − b) + 1)
"""

from __future__ import annotations

import numpy as np

FUNCTIONS = ("constant", "poly", "hinge")


def staleness_factor(function: str, staleness: int, a: float, b: float) -> float:
    """s(staleness) of ``function``; ``a`` and ``b``: poly's exponent, hinge's slope and knee."""
    if function == "poly":
        return (staleness + 1) ** (-a)
    if function == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1)
    return 1.0


def mix(weights: np.ndarray, trained: np.ndarray, a: float) -> np.ndarray:
    """(1 − a)·weights + a·trained, float32 out."""
    return ((1 - a) * weights + a * trained).astype(np.float32)
