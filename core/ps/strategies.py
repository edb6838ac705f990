"""The parameter server's strategy, built from the ps keys out of the rules FL's controller uses
(core.fl.rules, core.fl.strategy: the one interface of a federation), and the worker's side of a
round (how many local iterations it has, ``local_iterations``).

The synchronous rules are FedAvg's (esync, ssgd, fedavg), FedDrop's and TiFL's, each update
weighed by the data its worker holds (n_k, Eq. 13-14) in the paper's rounding (``shares_first``:
mode ps's pinned models were trained so); the asynchronous ones are ASGD, DC-ASGD and FedAsync.
"""

from __future__ import annotations

from dtemu.core.compression.codecs import Dense
from dtemu.core.fl import aggregate
from dtemu.core.fl.rules import FedDrop, TiFL
from dtemu.core.fl.strategy import ASGD, DCASGD, FedAsync, Strategy, Tiers
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


def make_strategy(ps: PSSpec, ranks: list[int], seed: int) -> Strategy:
    """The server's strategy from the ps keys."""
    if ps.algorithm == "asgd":
        return ASGD(ps.global_lr)
    if ps.algorithm == "dcasgd":
        return DCASGD(ps.global_lr, ps.lr, ps.dcasgd_lambda)
    if ps.algorithm == "fedasync":
        return FedAsync(ps.fedasync_alpha, ps.staleness, ps.poly_a, ps.hinge_a, ps.hinge_b)
    if ps.algorithm == "feddrop":
        return FedDrop(ps.global_lr, ps.feddrop_k_hat, shares_first=True)
    if ps.algorithm == "tifl":
        return TiFL(ps.global_lr, Tiers(ranks, ps.tifl_tiers, ps.tifl_tier_probs, ps.tifl_credits,
                                        ps.tifl_workers_per_round, seed), shares_first=True)
    return aggregate.FedAvg(ps.global_lr, shares_first=True)   # esync, ssgd, fedavg


def weighed(updates: list[Update], samples: dict[int, int]) -> list[aggregate.Update]:
    """A round's pushes as FedAvg's updates: each weighed by the data its worker holds (the
    server's own count, not the one the push claims)."""
    return [aggregate.Update(client=u.worker, num_samples=samples[u.worker], kind="delta",
                             payload=Dense(u.delta)) for u in updates]
