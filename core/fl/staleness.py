"""The rules for an update made on a model that has moved since, each written once.

FedAsync (Xie et al., "Asynchronous Federated Optimization", 2019), for the FL controller
(fl.algorithm fedasync):

    x ← (1 − a)·x + a·x_k,   a = α · s(t − τ)

x_k the model a client trained from version τ, t the server's version now, and s one of

    constant  s = 1
    poly      s = (staleness + 1)^(−a)
    hinge     s = 1 for staleness ≤ b, else 1 / (a·(staleness − b) + 1)

DC-ASGD's delay compensation (Zheng et al., 2017), for the FL controller (fl.algorithm dcasgd)
and geo's MixedSync global PS (geo.dcasgd_lambda):

    g' = g + λ·g⊙g⊙(w_now − w_then)
"""

from __future__ import annotations

import numpy as np

FUNCTIONS = ("constant", "poly", "hinge")


def staleness_factor(function: str, staleness: int, poly_a: float, hinge_a: float, hinge_b: float) -> float:
    """s(staleness) of ``function``: poly's exponent, hinge's slope and knee as named."""
    if function == "poly":
        return (staleness + 1) ** (-poly_a)
    if function == "hinge":
        return 1.0 if staleness <= hinge_b else 1.0 / (hinge_a * (staleness - hinge_b) + 1)
    return 1.0


def compensated(g: np.ndarray, lam: float, now: np.ndarray, then: np.ndarray) -> np.ndarray:
    """DC-ASGD's gradient ``g`` (float32) corrected for the model having moved from ``then`` to ``now``."""
    return g + np.float32(lam) * g * g * (now - then)


def mix(weights: np.ndarray, trained: np.ndarray, a: float) -> np.ndarray:
    """(1 − a)·weights + a·trained, float32 out."""
    return ((1 - a) * weights + a * trained).astype(np.float32)
