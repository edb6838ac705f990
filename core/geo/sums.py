"""What geo's parameter servers compute on a round's payloads: a site's share of the sum, the
root's sum, the global PS's step.  Each is one op of core.runtime.compute.CPU_OPS that the roles
(core.geo.roles) hand to ``_Base.cpu``, so that emu can time it when the scenario prices it."""

from __future__ import annotations

import numpy as np

from dtemu.core.fl.staleness import compensated
from dtemu.core.geo.common import Applier
from dtemu.core.ml.params import params_vector


def site_share(got: dict, workers: list[str], dim: int, workers_total: int, site_size: int,
               sync: str) -> np.ndarray:
    """A local PS's sum of its workers' gradients, as the share it pushes to the global PS."""
    total = np.zeros(dim, np.float32)
    for w in workers:   # in a fixed order: arrival order changes no bit
        total += got[w][0].dense()
    if sync == "mixed":   # the site's mean gradient: the global PS applies each site's as it comes
        return total / np.float32(len(workers))
    share = total / np.float32(workers_total)   # the site's part of the mean over every worker
    if len(workers) < site_size:
        share *= np.float32(site_size / len(workers))
    return share


def root_sum(got: dict, children: list[str], dim: int, hips: bool, present: int, workers_total: int) -> np.ndarray:
    """The global (or flat) PS's dense sum of a round's pushes, as the mean over every worker."""
    total = np.zeros(dim, np.float32)
    for c in children:
        total += got[c][0].dense()
    if not hips:  # the flat PS has every worker's gradient: it takes the mean itself
        total /= np.float32(present)
    elif present < workers_total:  # each site sent its part of the mean over every worker
        total *= np.float32(workers_total / present)
    return total


def applied(applier: Applier, model, update: np.ndarray, round_: int) -> np.ndarray:
    """The global PS's model after round ``round_``'s ``update`` (geo.global_optimizer: weights go down)."""
    applier.apply(update, round_)
    return params_vector(model)


def mixed_apply(applier: Applier, model, grad: np.ndarray, pulled: np.ndarray, dcasgd_lambda: float,
                round_: int) -> np.ndarray:
    """MixedSync's global step: a site's gradient of its round ``round_`` (DC-ASGD: g + lambda
    g*g*(w_now - w_when_pulled)) applied at that round's learning rate; the weights after it."""
    if dcasgd_lambda > 0:
        grad = compensated(grad, dcasgd_lambda, params_vector(model), pulled)
    applier.apply(grad, round_)
    return params_vector(model)
