"""The ``fl`` section of a scenario: federated learning's keys, each with its default and what it
means (core.scenario puts the sections together and checks them across keys)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dtemu.core.schema import U16, U32, between, check, decay, fraction, non_negative, positive


@dataclass(frozen=True)
class AvailabilitySpec:
    """When a client is there to be asked (core/fl/population.py)."""

    # always: every client, every round; onoff: each client alternates online and offline
    # stretches of exponential length (means below), seeded per client; trace: the online
    # windows a file lists (docs/scenarios.md gives its format; host/ reads it).
    kind: Literal["always", "onoff", "trace"] = "always"
    mean_on_s: float = field(default=600.0, metadata=check(positive))
    mean_off_s: float = field(default=600.0, metadata=check(positive))
    trace: str | None = None


@dataclass(frozen=True)
class ServerOptSpec:
    """fedadam, fedyogi, fedadagrad: the server optimizer's step on the round's mean delta
    (core/fl/server_opt.py; Reddi et al.'s η, β1, β2, τ)."""

    eta: float = field(default=0.01, metadata=check(positive))
    beta1: float = field(default=0.9, metadata=check(decay))
    beta2: float = field(default=0.99, metadata=check(decay))
    tau: float = field(default=1e-3, metadata=check(positive))



@dataclass(frozen=True)
class FedAsyncSpec:
    """fedasync: x ← (1 − a)·x + a·x_k with a = alpha · s(staleness) (core/fl/staleness.py)."""

    alpha: float = field(default=0.6, metadata=check(fraction))
    staleness: Literal["constant", "poly", "hinge"] = "constant"
    poly_a: float = field(default=0.5, metadata=check(non_negative))
    hinge_a: float = field(default=10.0, metadata=check(non_negative))
    hinge_b: float = field(default=4.0, metadata=check(non_negative))


@dataclass(frozen=True)
class FedDropSpec:
    """feddrop: a round closes once all but k_hat of the clients asked have answered; the rest
    come late and are dropped (core/fl/strategy.py)."""

    k_hat: int = field(default=0, metadata=check(non_negative))


@dataclass(frozen=True)
class TiFLSpec:
    """tifl: the clients in tiers by their time to answer in the first round; each later round
    asks fl.sample (or all) of one tier's available clients, the tier drawn by its probability
    among those with credits left (core/fl/strategy.py)."""

    tiers: int = field(default=2, metadata=check(positive))
    tier_probs: list[float] = field(default_factory=list)   # empty: every tier alike
    credits: list[int] = field(default_factory=list)        # times each tier may be drawn; empty: no limit


@dataclass(frozen=True)
class ESyncSpec:
    """esync: each client asks the state server, after every local iteration, whether to train once
    more or send its update (ESync's Algorithm 1, core/esync/state_table.py; core/fl/esync.py)."""

    # The most local iterations a client runs in a round; then it sends without asking (None: the
    # state server alone decides).
    max_iterations: int | None = field(default=None, metadata=check(positive))
    # A question the state server has not answered in this time counts as SYNC.
    query_timeout_s: float = field(default=5.0, metadata=check(positive))


@dataclass(frozen=True)
class FLSpec:
    clients: int = field(default=2, metadata=check(between(1, U16, "client ranks")))
    # Rounds, epochs and subsets travel in a TrainCmd as u32, u16 and u32.
    rounds: int = field(default=10, metadata=check(between(1, U32, "a round is 32 bits on the wire")))
    epochs: int = field(default=1, metadata=check(between(1, U16, "16 bits on the wire")))
    # Samples drawn from each client's partition per round (None: all of it).
    subset: int | None = field(default=None, metadata=check(between(1, U32, "32 bits on the wire")))
    batch_size: int = field(default=64, metadata=check(positive))
    lr: float = field(default=0.05, metadata=check(positive))
    momentum: float = field(default=0.0, metadata=check(non_negative))
    weight_decay: float = field(default=0.0, metadata=check(non_negative))
    codec: Literal["fp32", "q8", "s4", "sq8"] = "fp32"
    # The model on its way down: fp32, the whole model; q8 / s4 / sq8: a delta on the model
    # the clients hold, with that codec (core/fl/downlink.py).
    downlink_codec: Literal["fp32", "q8", "s4", "sq8"] = "fp32"
    chunk: int = field(default=8192, metadata=check(positive))
    density: float = field(default=0.1, metadata=check(fraction))
    # Clients add the unsent residual of a lossy codec to their next update.
    error_feedback: bool = False
    # emu: at most this many clients' residuals in memory, the least recently used spilled
    # to files in the run folder (None: every client keeps its own in memory).
    residuals_in_memory: int | None = field(default=None, metadata=check(positive))
    server_lr: float = field(default=1.0, metadata=check(positive))
    # The update rule: fedavg (the weighted mean delta, times server_lr); fedprox (fedavg, and each
    # client adds proximal_mu/2 · ||w − w_global||² to its loss); fedadam, fedyogi, fedadagrad
    # (the mean delta drives a server optimizer, server_opt); fedasync (no rounds: each update is
    # mixed in as it comes, fl.fedasync, and its client asked again; fl.sample train at once);
    # feddrop (fl.feddrop) and tifl (fl.tifl): fedavg's aggregation, their own quorum and choice
    # of clients; asgd (w + server_lr·Δ) and dcasgd (delay-compensated, fl.dcasgd_lambda): one
    # update at a time, as fedasync (core/fl/rules.py); esync (fedavg's aggregation, and each
    # client trains until the state server says SYNC, fl.esync: a node of its own, "ss").
    algorithm: Literal["fedavg", "fedprox", "fedadam", "fedyogi", "fedadagrad", "fedasync", "feddrop", "tifl",
                       "asgd", "dcasgd", "esync"] = "fedavg"
    proximal_mu: float = field(default=0.0, metadata=check(non_negative))
    server_opt: ServerOptSpec = field(default_factory=ServerOptSpec)
    fedasync: FedAsyncSpec = field(default_factory=FedAsyncSpec)
    feddrop: FedDropSpec = field(default_factory=FedDropSpec)
    tifl: TiFLSpec = field(default_factory=TiFLSpec)
    esync: ESyncSpec = field(default_factory=ESyncSpec)
    dcasgd_lambda: float = field(default=0.04, metadata=check(non_negative))
    min_clients: int = field(default=1, metadata=check(positive))
    round_timeout_s: float = field(default=600.0, metadata=check(positive))
    barrier_timeout_s: float = field(default=60.0, metadata=check(positive))
    # Start round 1 without every client when at least min_clients matched?
    barrier_require: Literal["all", "min_clients"] = "all"
    # A round with fewer than min_clients updates: keep the model and go on,
    # run the same round again (at most max_retries times), or stop the run.
    on_failed_round: Literal["continue", "retry", "stop"] = "continue"
    max_retries: int = field(default=3, metadata=check(between(0, U16)))
    # Updates whose L2 norm exceeds this are rejected (None: no bound).
    max_update_norm: float | None = field(default=None, metadata=check(positive))
    eval_every: int = field(default=1, metadata=check(positive))
    # Also stop after the round (the update, under an asynchronous rule) that ends at or past this time
    # on the runtime's clock, and evaluate it (None: only after fl.rounds).
    max_time_s: float | None = field(default=None, metadata=check(positive))
    # The initial model: the model's own seeded initialisation, or Xavier-uniform weights and zero
    # biases from the seed (ESync's w^0 = Xavier(f), Algorithm 2; core.ml.models.xavier_init).
    init: Literal["seeded", "xavier"] = "seeded"
    # Resume from this checkpoint (written by an earlier run of this scenario).
    init_path: str | None = None
    # Clients asked per round, drawn from the round seed among those available: a fraction
    # of fl.clients in (0, 1), or a count >= 1; at least sample_min (None: every client).
    sample: float | None = field(default=None, metadata=check(positive))
    sample_min: int = field(default=1, metadata=check(positive))
    availability: AvailabilitySpec = field(default_factory=AvailabilitySpec)

    @property
    def asked_per_round(self) -> int:
        """Clients a round asks when enough are available (fl.sample, at least fl.sample_min)."""
        if self.sample is None:
            return self.clients
        wanted = math.ceil(self.sample * self.clients - 1e-9) if self.sample < 1 else int(self.sample)
        return min(self.clients, max(wanted, self.sample_min))

    @property
    def sampled(self) -> bool:
        """Does a round ask only some clients (a sample, or only those available)?"""
        return self.sample is not None or self.availability.kind != "always"
