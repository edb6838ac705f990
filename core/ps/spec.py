"""The ``ps:`` section of a scenario: a parameter server, a state server and K workers.

One mode, several algorithms (``ps.algorithm``), each a setting of the same roles
(``core.ps.server``, ``core.ps.state_server``, ``core.ps.worker``):

- ``esync``: ESync; each worker asks the state server after every local iteration
  whether to TRAIN once more or SYNC (Algorithm 1), so fast workers fill the time
  the straggler needs instead of blocking;
- ``ssgd``: synchronous SGD, one local iteration per round;
- ``fedavg``: ``local_epochs`` epochs per round; ``feddrop``: FedAvg that aggregates as soon
  as K - ``feddrop_k_hat`` updates are in and drops the rest; ``tifl``: FedAvg over the
  workers of one tier per round, tiers by measured latency;
- ``asgd``, ``dcasgd`` (delay compensation, ``dcasgd_lambda``), ``fedasync`` (mixing
  ``fedasync_alpha`` with a ``staleness`` function): asynchronous, the server applies each
  update as it comes and answers the sender alone.

This module holds no logic but the checks across keys; it imports nothing of the
scenario so that ``core.scenario`` can import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtemu.core.errors import ScenarioError
from dtemu.core.fl.strategy import check_tiers
from dtemu.core.schema import U16, U32, between, check, non_negative, positive, probability

PS = "ps"  # rank 0: the parameter server
SS = "ss"  # rank 1: the state server
ALGORITHMS = ("esync", "ssgd", "asgd", "dcasgd", "fedavg", "fedasync", "feddrop", "tifl")
ASYNCHRONOUS = frozenset({"asgd", "dcasgd", "fedasync"})


@dataclass(frozen=True)
class PSSpec:
    # Workers worker1..workerK, ranks 2..K+1 (ranks travel as u16 in state messages).
    workers: int = field(default=4, metadata=check(between(1, U16 - 2, "ranks are 16 bits on the wire")))
    algorithm: Literal["esync", "ssgd", "asgd", "dcasgd", "fedavg", "fedasync", "feddrop", "tifl"] = "esync"
    # Global model versions to make: rounds (synchronous algorithms) or applied updates (asynchronous).
    rounds: int = field(default=20, metadata=check(between(1, U32, "a round is 32 bits on the wire")))
    # Also stop at this time on the runtime's clock (None: only after `rounds`).
    max_time_s: float | None = field(default=None, metadata=check(positive))
    batch_size: int = field(default=32, metadata=check(positive))
    lr: float = field(default=0.05, metadata=check(positive))  # local SGD learning rate (eta)
    global_lr: float = field(default=1.0, metadata=check(positive))  # epsilon: w += epsilon * mean delta
    # Initial global model: the model's own seeded init, or Xavier-uniform weights and zero biases.
    init: Literal["seeded", "xavier"] = "xavier"
    # Every worker runs exactly this many local iterations per round (esync: instead of asking the
    # state server): a deterministic schedule, the same model in emu and real.
    fixed_iterations: int | None = field(default=None, metadata=check(positive))
    # esync: the most local iterations a worker runs in a round; there it SYNCs without asking.  On
    # non-IID data a fast party's many iterations on its few labels drift from the others' before
    # each average (docs/notebook/2026-11-23-09-esync-issue-10.md, "ESync on non-IID data").  None: the state server alone decides.
    max_local_iterations: int | None = field(default=None, metadata=check(positive))
    # fedavg, feddrop, tifl, fedasync: local epochs over the worker's data per round.
    local_epochs: int = field(default=1, metadata=check(between(1, U16)))
    eval_every: int = field(default=1, metadata=check(positive))  # global versions between evaluations
    # Also evaluate when this much time passed since the last evaluation (None: by versions only).
    eval_every_s: float | None = field(default=None, metadata=check(positive))
    # A synchronous round closes this long after it started with the updates in (at least min_workers).
    round_timeout_s: float = field(default=600.0, metadata=check(positive))
    min_workers: int = field(default=1, metadata=check(positive))
    # A worker that hears no RESPONSE this long after a QUERY synchronises (the state server is down).
    query_timeout_s: float = field(default=5.0, metadata=check(positive))
    # How long the roles wait for their peers at the start.
    barrier_timeout_s: float = field(default=60.0, metadata=check(positive))
    dcasgd_lambda: float = field(default=0.04, metadata=check(non_negative))
    fedasync_alpha: float = field(default=0.6, metadata=check(probability))
    staleness: Literal["constant", "poly", "hinge"] = "constant"
    poly_a: float = field(default=0.5, metadata=check(non_negative))
    hinge_a: float = field(default=10.0, metadata=check(non_negative))
    hinge_b: float = field(default=4.0, metadata=check(non_negative))
    feddrop_k_hat: int = field(default=0, metadata=check(non_negative))
    # TiFL: tiers by measured latency (the first round is run by everyone to measure it).
    tifl_tiers: int = field(default=2, metadata=check(positive))
    tifl_tier_probs: list[float] = field(default_factory=list)  # empty: every tier alike
    tifl_credits: list[int] = field(default_factory=list)  # times each tier may be chosen; empty: no limit
    tifl_workers_per_round: int = field(default=4, metadata=check(positive))

    @property
    def worker_names(self) -> list[str]:
        return [f"worker{i}" for i in range(1, self.workers + 1)]

    @property
    def uses_state_server(self) -> bool:
        """ESync's adaptive rule asks the state server; every other schedule is fixed."""
        return self.algorithm == "esync" and self.fixed_iterations is None

    @property
    def asynchronous(self) -> bool:
        return self.algorithm in ASYNCHRONOUS


def validate_ps(ps: PSSpec) -> None:
    """Checks across the ``ps`` keys (the scenario's other checks are core.scenario's)."""
    if ps.min_workers > ps.workers:
        raise ScenarioError("ps.min_workers", f"{ps.min_workers} is more than ps.workers ({ps.workers})")
    if ps.feddrop_k_hat >= ps.workers:
        raise ScenarioError("ps.feddrop_k_hat", f"must leave at least one of the {ps.workers} workers")
    if ps.max_local_iterations is not None and not ps.uses_state_server:
        raise ScenarioError("ps.max_local_iterations", "bounds ESync's adaptive rounds only "
                                                       "(ps.algorithm: esync without ps.fixed_iterations)")
    check_tiers(("ps.tifl_tiers", "ps.tifl_tier_probs", "ps.tifl_credits"), ps.tifl_tiers, ps.tifl_tier_probs,
                ps.tifl_credits, ps.workers, "workers")
