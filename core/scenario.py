"""The scenario: one YAML file, typed and validated, that both runtimes run unchanged.

``parse_scenario(raw, overrides)`` takes the YAML's mapping (``host/scenario_file.py``
reads the file, within the bounds of ``core.bounded_yaml``), applies
``--set key.path=value`` overrides, builds the dataclasses below (see ``core.schema`` for the error
format) and then checks what only makes sense across fields (a quorum larger
than the clients, a node name that does not exist, ...), so a scenario that
cannot work is refused before anything starts.

(About 415 lines: every key of the schema with its default and a comment, and the
checks across keys, in one place where a reader finds them all.)
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from dtemu.core.ddp.collectives import FRAME_BYTES
from dtemu.core import bounded_yaml
from dtemu.core.errors import ScenarioError
from dtemu.core.fl.strategy import RULE_KEYS
from dtemu.core.flower.spec import FlowerSpec
from dtemu.core.geo.spec import GeoSpec, SiteSpec, central_site
from dtemu.core.ml.user_code import BUILTIN_TASKS as TASKS, model_spec
from dtemu.core.modes import MODES, Mode
from dtemu.core.fl.names import CLIENT_CRASH_POINTS, CONTROLLER, CONTROLLER_CRASH_POINTS  # noqa: F401 (their old home)
from dtemu.core.ps.spec import PSSpec
from dtemu.core.schema import U16, U32, between, build, check, decay, fraction, non_negative, positive, probability

CODEC_NAMES = ("fp32", "q8", "s4", "sq8")


@dataclass(frozen=True)
class DataSpec:
    dataset: Literal["mnist", "fashion_mnist"] = "mnist"
    # Where the IDX archives live; else $DTEMU_DATA; else the user cache.
    root: str | None = None
    # A user data set: "package.module:factory" returning (x_train, y_train, x_test, y_test).
    factory: str | None = None
    partition: Literal["iid", "shards", "dirichlet"] = "iid"
    alpha: float = field(default=0.5, metadata=check(positive))
    shards_per_client: int = field(default=2, metadata=check(positive))
    # Evaluate on the first N test samples (None: the whole test set).
    test_samples: int | None = field(default=None, metadata=check(positive))


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
    more or send its update (ESync's Algorithm 1, core/ps/state_table.py; core/fl/esync.py)."""

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


@dataclass(frozen=True)
class DDPSpec:
    workers: int = field(default=2, metadata=check(between(1, U16, "ranks are 16 bits in collective frames")))
    epochs: int = field(default=1, metadata=check(positive))
    # Stop after this many steps in all (None: run every epoch to the end).
    max_steps: int | None = field(default=None, metadata=check(positive))
    batch_size: int = field(default=64, metadata=check(positive))
    lr: float = field(default=0.01, metadata=check(positive))
    momentum: float = field(default=0.9, metadata=check(non_negative))
    nesterov: bool = False
    weight_decay: float = field(default=0.0, metadata=check(non_negative))
    # none: dense gradients by allreduce; dgc: Deep Gradient Compression by allgather.
    compression: Literal["none", "dgc"] = "none"
    # Dense allreduce: the pipelined reduce-scatter + allgather (core.ddp.pipelined: float32 in
    # rank order, the same bits on every rank; the fastest for real, 0.5-0.9x gloo's time), everyone
    # sending everything to everyone (gather, float64), or a ring (float64).
    allreduce: Literal["gather", "ring", "pipelined"] = "pipelined"
    density: float = field(default=0.001, metadata=check(fraction))
    sample_ratio: float = field(default=0.01, metadata=check(fraction))
    clip_norm: float | None = field(default=None, metadata=check(positive))
    warmup_densities: list[float] = field(default_factory=lambda: [0.25, 0.0625, 0.015625, 0.004])
    # Steps per warm-up stage (None: one epoch per stage; 0: no warm-up).
    warmup_steps_per_stage: int | None = field(default=None, metadata=check(non_negative))
    # Tensors smaller than this travel dense (biases).
    dense_below: int = field(default=1024, metadata=check(non_negative))
    fp16_values: bool = False
    frame_bytes: int = field(default=FRAME_BYTES, metadata=check(positive))
    step_timeout_s: float = field(default=60.0, metadata=check(positive))
    barrier_timeout_s: float = field(default=60.0, metadata=check(positive))
    # Steps per profiling window (mean and max of each number).
    window: int = field(default=20, metadata=check(positive))
    eval_every_epochs: int = field(default=1, metadata=check(positive))
    # A worker lost mid-run (a step's payload missing after step_timeout_s) must not
    # hang the others: "stop" ends the run cleanly (every survivor reports the lost
    # ranks and the step, the run still writes its summary); "continue" lets the
    # survivors agree on a new membership and train on from the lowest survivor's
    # state, averaging over themselves only.  Continuing needs at least min_workers
    # survivors (None: all workers, so that a loss stops the run unless the scenario
    # says how few may go on); fewer stop the run as "stop" does.
    on_worker_lost: Literal["stop", "continue"] = "stop"
    min_workers: int | None = field(default=None, metadata=check(positive))


@dataclass(frozen=True)
class LinkSpec:
    up_mbps: float = field(default=1000.0, metadata=check(positive))
    down_mbps: float = field(default=1000.0, metadata=check(positive))
    latency_ms: float = field(default=0.5, metadata=check(non_negative))
    loss: float = field(default=0.0, metadata=check(probability))


@dataclass(frozen=True)
class LinkOverride:
    up_mbps: float | None = field(default=None, metadata=check(positive))
    down_mbps: float | None = field(default=None, metadata=check(positive))
    latency_ms: float | None = field(default=None, metadata=check(non_negative))
    loss: float | None = field(default=None, metadata=check(probability))


@dataclass(frozen=True)
class NetworkSpec:
    default: LinkSpec = field(default_factory=LinkSpec)
    nodes: dict[str, LinkOverride] = field(default_factory=dict)
    mtu: int = field(default=1500, metadata=check(positive))
    # A message to many receivers (the model to every client): one flow per receiver
    # (unicast), or one copy per link (multicast, as DDS over IP multicast on a LAN).
    delivery: Literal["unicast", "multicast"] = "unicast"
    # Data centres (core.geo.spec): each a LAN and a WAN attachment; empty: the flat star.
    sites: dict[str, SiteSpec] = field(default_factory=dict)
    # The central site (geo: master and global PS); None: the first of network.sites.
    central: str | None = None
    # Emu's time on the wire as real mode's DDS transport spends it (emu/wire_model.py); byte
    # counts in summaries stay payload.  framing "rtps": a flow also carries the frames', RTPS
    # fragments', UDP, IPv4 and Ethernet headers ("payload": the payload only).
    framing: Literal["payload", "rtps"] = "payload"
    # A sender's writer history in bytes (real mode: DDS WhcHigh, 2 MiB): a send returns once
    # the message's last history group is all that is left on the wire, and later sends from
    # that node queue behind it (the link is a FIFO).  0: a send returns when its flows end.
    send_window_bytes: int = field(default=0, metadata=check(non_negative))


@dataclass(frozen=True)
class SlowdownStep:
    """From ``at_s`` on (the runtime's clock) the node's slowdown is ``slowdown``."""

    at_s: float = field(metadata=check(non_negative))
    slowdown: float = field(metadata=check(positive))


@dataclass(frozen=True)
class VaryingSlowdown:
    """A seeded random process: every ``period_s`` the slowdown is multiplied by a new factor
    drawn log-uniformly from [low, high] (from the seed, the node and the period's index)."""

    period_s: float = field(metadata=check(positive))
    low: float = field(default=1.0, metadata=check(positive))
    high: float = field(default=2.0, metadata=check(positive))


@dataclass(frozen=True)
class CpuCosts:
    """Emu only: seconds of a node's CPU per MB (1e6 bytes) of the model's fp32 vector (4 bytes a
    parameter) for the work a role does outside training (core.runtime.compute.CPU_OPS); 0: free.
    Geo's roles charge them (core.geo.roles); ``emu calibrate`` measures them (emu.costs)."""

    encode_s_per_mb: float = field(default=0.0, metadata=check(non_negative))    # a vector into a dense payload
    sum_s_per_mb: float = field(default=0.0, metadata=check(non_negative))       # one dense payload added to a sum
    sparsify_s_per_mb: float = field(default=0.0, metadata=check(non_negative))  # BiSparse: residual, top-k, encoding
    merge_s_per_mb: float = field(default=0.0, metadata=check(non_negative))     # one sparse payload summed by index
    densify_s_per_mb: float = field(default=0.0, metadata=check(non_negative))   # a sparse aggregate made dense, encoded
    apply_s_per_mb: float = field(default=0.0, metadata=check(non_negative))     # the update into the model (SGD step)

    def any(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class ComputeSpec:
    # Modelled training cost per sample; None: the model's reference cost.
    train_s_per_sample: float | None = field(default=None, metadata=check(positive))
    slowdown: float = field(default=1.0, metadata=check(positive))
    # Each compute step takes slowdown * cost * (1 + U(-jitter, +jitter)), from the seed.
    jitter: float = field(default=0.0, metadata=check(probability))
    # Speed that changes over time: steps that set the slowdown from a time on, and/or a random factor.
    schedule: list[SlowdownStep] = field(default_factory=list)
    varying: VaryingSlowdown | None = None
    # Emu only: seconds of CPU per MB (1e6 bytes) of every message a node receives (reassembly,
    # decoding, checks) before its role gets it; 0: none (real mode spends what it spends).
    decode_s_per_mb: float = field(default=0.0, metadata=check(non_negative))
    # Emu only: seconds of CPU per message sent (before it leaves: the transport's write) and per
    # message received (before its role has it: the receive thread, the hand-off), whatever its size.
    send_s_per_message: float = field(default=0.0, metadata=check(non_negative))
    recv_s_per_message: float = field(default=0.0, metadata=check(non_negative))
    # Emu only: the CPU work outside training, priced per MB of the model (CpuCosts); all 0: free.
    cpu: CpuCosts = field(default_factory=CpuCosts)


@dataclass(frozen=True)
class ComputeOverride:
    train_s_per_sample: float | None = field(default=None, metadata=check(positive))
    slowdown: float | None = field(default=None, metadata=check(positive))
    jitter: float | None = field(default=None, metadata=check(probability))
    schedule: list[SlowdownStep] | None = None
    varying: VaryingSlowdown | None = None
    decode_s_per_mb: float | None = field(default=None, metadata=check(non_negative))
    send_s_per_message: float | None = field(default=None, metadata=check(non_negative))
    recv_s_per_message: float | None = field(default=None, metadata=check(non_negative))
    cpu: CpuCosts | None = None   # replaces the default's block as a whole


@dataclass(frozen=True)
class ComputeModel:
    default: ComputeSpec = field(default_factory=ComputeSpec)
    nodes: dict[str, ComputeOverride] = field(default_factory=dict)
    # Emu only: the nodes share this many cores for their CPU work priced per MB (``cpu`` and
    # ``decode_s_per_mb``): at most that many such jobs run at once, the others wait their turn
    # (as real ranks on one machine do); 0: every node has cores of its own.
    shared_cores: int = field(default=0, metadata=check(non_negative))
    # A calibration profile (``emu calibrate``) whose costs the loader applied (host.profile): its
    # path, made absolute; the values it set are in the keys above.
    profile: str | None = None


@dataclass(frozen=True)
class OfflineWindow:
    node: str
    start_s: float = field(metadata=check(non_negative))
    # None: the node never comes back.
    end_s: float | None = None


@dataclass(frozen=True)
class CrashSpec:
    """A crash at a point of the protocol rather than at a time, so that it
    hits the same step of the same round in emu and for real."""

    node: str
    round: int = field(metadata=check(positive))
    # Clients: before_train (the command arrived), during_train, mid_upload
    # (half of the update's bytes sent), after_upload.  Controller: mid_round
    # (the command is out, no update in yet), before_checkpoint (aggregated,
    # not saved: the round must be done again), after_checkpoint (saved, the
    # new model not yet published).
    at: Literal["before_train", "during_train", "mid_upload", "after_upload",
                "mid_round", "before_checkpoint", "after_checkpoint"] = "during_train"
    # Restart (from scratch; the controller from its latest checkpoint) this
    # long after the crash; None: the node stays down.
    restart_after_s: float | None = field(default=None, metadata=check(non_negative))


@dataclass(frozen=True)
class PartitionSpec:
    """``nodes`` can reach one another but no one else from start_s to end_s;
    messages that cross the cut meanwhile are lost (a partition is not a
    restart: nothing is replayed when it heals)."""

    nodes: list[str]
    start_s: float = field(metadata=check(non_negative))
    end_s: float = field(metadata=check(positive))


@dataclass(frozen=True)
class CorruptSpec:
    """A faulty (or hostile) client whose updates go out damaged."""

    node: str
    # nan / inf: some values replaced; scale: every value times `scale` (caught
    # by fl.max_update_norm); garbage: the codec packet overwritten with noise;
    # stale: the update claims the previous round.
    kind: Literal["nan", "inf", "scale", "garbage", "stale"] = "nan"
    # The rounds in which it misbehaves (empty: every round).
    rounds: list[int] = field(default_factory=list)
    scale: float = field(default=1e6, metadata=check(positive))


@dataclass(frozen=True)
class FaultSpec:
    # Each client sits out each round with this probability (decided from the seed).
    dropout_p: float = field(default=0.0, metadata=check(probability))
    # Crashes: the node loses its state, misses what is sent meanwhile, and
    # (if end_s is set) restarts from scratch.
    offline: list[OfflineWindow] = field(default_factory=list)
    crashes: list[CrashSpec] = field(default_factory=list)
    partitions: list[PartitionSpec] = field(default_factory=list)
    # Per delivered message (decided from the seed): lost outright (beyond the
    # link's packet loss, which reliable delivery repairs), delivered twice,
    # or held back by up to reorder_s so that later messages overtake it.
    message_loss: float = field(default=0.0, metadata=check(probability))
    duplicate_p: float = field(default=0.0, metadata=check(probability))
    reorder_s: float = field(default=0.0, metadata=check(non_negative))
    corrupt: list[CorruptSpec] = field(default_factory=list)

    @property
    def perturbs_delivery(self) -> bool:
        return bool(self.partitions or self.message_loss or self.duplicate_p or self.reorder_s)


@dataclass(frozen=True)
class Scenario:
    # Names run folders (runs/<name>-<date>-<time>): letters, digits, . _ -, at most 100.
    name: str
    mode: Literal["fl", "ddp", "ps", "geo", "flower"] = "fl"
    seed: int = field(default=0, metadata=check(between(0, (1 << 63) - 1, "a 64-bit seed")))
    model: str = "mnist_cnn"
    # What it learns, as a plugin (core.ml.task): "package.module:Name" supplying the model, the data,
    # the loss and what counts as right; None: ``model`` and ``data`` make the built-in classification.
    task: str | None = None
    # torch threads per process.  1: dtemu's parallelism is processes (emu's pool, real's ranks), and N
    # processes of one thread fit N cores (host.cores); a count is part of the arithmetic, so both modes
    # use the scenario's.
    threads: int = field(default=1, metadata=check(positive))
    # Where the training runs: cpu; cuda (a GPU: refused at load where torch sees none, and, until the
    # GPU path is built, everywhere); auto (a GPU if there is one and dtemu can use it, else the CPU).
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    data: DataSpec = field(default_factory=DataSpec)
    fl: FLSpec = field(default_factory=FLSpec)
    ddp: DDPSpec = field(default_factory=DDPSpec)
    # mode ps: a parameter server, a state server and workers (ESync and its baselines, core.ps)
    ps: PSSpec = field(default_factory=PSSpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    compute: ComputeModel = field(default_factory=ComputeModel)
    faults: FaultSpec = field(default_factory=FaultSpec)
    # mode geo: hierarchical parameter servers across data centres (core.geo)
    geo: GeoSpec = field(default_factory=GeoSpec)
    # mode flower: an unmodified Flower app over dtemu's network and clock (core.flower)
    flower: FlowerSpec = field(default_factory=FlowerSpec)
    # Accuracies whose first time summary.json reports (time_to_accuracy); they measure, not steer.
    targets: list[float] = field(default_factory=lambda: [0.8, 0.9, 0.95])

    # --- derived -------------------------------------------------------
    @property
    def model_spec(self) -> str:
        """What the roles build: the task's model ("task:" + spec), or the ``model`` key."""
        return model_spec(self.task, self.model)

    @property
    def client_names(self) -> list[str]:
        return [f"client{i}" for i in range(1, self.fl.clients + 1)]

    @property
    def worker_names(self) -> list[str]:
        return [f"worker{i}" for i in range(self.ddp.workers)]

    @property
    def kind(self) -> Mode:
        """The mode's object (core.modes): its nodes, roles, summary and rules."""
        return MODES[self.mode]

    @property
    def node_names(self) -> list[str]:
        """Every node, in rank order (FL: rank 0 is the controller; DDP: worker<rank>)."""
        return self.kind.node_names(self)

    @property
    def training_nodes(self) -> list[str]:
        """The nodes whose traffic counts as bytes_up / bytes_down."""
        return self.kind.training_nodes(self)

    @property
    def central_site(self) -> str | None:
        return central_site(self.network.sites, self.network.central)

    @property
    def site_of(self) -> dict[str, str]:
        """Each node's site ({} without network.sites)."""
        return self.kind.site_of(self)

    def link(self, node: str) -> LinkSpec:
        site = self.site_of.get(node)
        if site is None:
            return _merge(self.network.default, self.network.nodes.get(node))
        lan = self.network.sites[site].lan   # a node in a site: its access link is the site's LAN
        base = LinkSpec(up_mbps=lan.bandwidth_mbps, down_mbps=lan.bandwidth_mbps, latency_ms=lan.latency_ms,
                        loss=self.network.default.loss)
        return _merge(base, self.network.nodes.get(node))

    def compute_for(self, node: str) -> ComputeSpec:
        return _merge(self.compute.default, self.compute.nodes.get(node))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        """A hash of what determines training, to match checkpoints to scenarios.

        init_path is left out (resuming is the point of a checkpoint) and so is
        the number of rounds (a run may be resumed to go on for longer).
        """
        d = self.to_dict()
        d["fl"] = {k: v for k, v in d["fl"].items() if k not in ("init_path", "rounds")}
        if d["fl"]["algorithm"] == "fedavg" and not d["fl"]["proximal_mu"]:  # (digests from before the rules)
            for key in ("algorithm", "proximal_mu", "server_opt", "fedasync"):
                del d["fl"][key]
        for key, rule in RULE_KEYS.items():
            if d["fl"].get("algorithm", "fedavg") != rule:   # (a rule's keys count only under that rule)
                del d["fl"][key]
        d.pop("targets")  # what is measured, not what is trained
        if d["task"] is None:  # (digests from before tasks)
            del d["task"]
        if d["device"] != "cuda":  # (digests from before devices; auto trains on the CPU today)
            del d["device"]
        for section in ("fl", "ddp", "ps", "geo", "flower"):  # what its mode does not train with
            if section not in self.kind.digest_sections:
                d.pop(section)
        if not self.network.sites:
            del d["network"]["sites"], d["network"]["central"]
        # Emu's timing of real mode's transport (issue 15): at their defaults a scenario keeps
        # the digest it had before these keys.
        if d["network"]["framing"] == "payload":
            del d["network"]["framing"]
        if not d["network"]["send_window_bytes"]:
            del d["network"]["send_window_bytes"]
        for key in ("decode_s_per_mb", "send_s_per_message", "recv_s_per_message"):
            if not d["compute"]["default"][key]:
                del d["compute"]["default"][key]
            for node in d["compute"]["nodes"].values():
                if node.get(key) is None:
                    node.pop(key, None)
        for node in d["compute"]["nodes"].values():
            if node.get("cpu") is None:
                node.pop("cpu", None)
        # ... nor do the CPU costs outside training (geo's roles) when they are absent.
        if not self.compute.default.cpu.any():
            del d["compute"]["default"]["cpu"]
        if not d["compute"]["shared_cores"]:
            del d["compute"]["shared_cores"]
        del d["compute"]["profile"]  # where the costs came from; the costs themselves are above
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def _merge(default, override):
    if override is None:
        return default
    # Field by field, not asdict: nested values (a compute schedule) stay dataclasses.
    values = {f.name: getattr(default, f.name) for f in fields(default)}
    values.update({f.name: getattr(override, f.name) for f in fields(override)
                   if getattr(override, f.name) is not None})
    return type(default)(**values)


# --- loading -----------------------------------------------------------


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one ``key.path=value`` to the raw YAML mapping (value parsed as YAML)."""
    if "=" not in assignment:
        raise ScenarioError("--set", f"expected key.path=value, got {assignment!r}")
    key, text = assignment.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ScenarioError("--set", f"bad key path {key!r}")
    value = bounded_yaml.load(text, f"the value of --set {key.strip()}") if text.strip() else None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ScenarioError(".".join(parts[: i + 1]), f"cannot set a key inside {child!r}")
        node = child
    node[parts[-1]] = value


def stretched(s: Scenario, factor: float) -> Scenario:
    """``s`` with every duration (a key ending in ``_s``: timeouts, fault times, restarts, delays)
    ``factor`` times as long.  Real mode runs a scenario on a machine slower than the one its
    compute model describes this way, so that the *relative* timing is the scenario's."""
    if factor == 1:
        return s

    def scale(node):
        if isinstance(node, dict):
            return {k: (v * factor if k.endswith("_s") and isinstance(v, (int, float)) and not isinstance(v, bool)
                        else scale(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [scale(v) for v in node]
        return node

    d = s.to_dict()
    for key, rule in RULE_KEYS.items():   # a rule's keys stay at their defaults under another rule
        if d["fl"]["algorithm"] != rule:  # (fl.esync.query_timeout_s, under fedavg, is no duration)
            del d["fl"][key]
    out = build(Scenario, scale(d))
    validate(out)
    return out


def parse_scenario(raw: Any, overrides: list[str] = ()) -> Scenario:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError("", f"a scenario must be a mapping, got {type(raw).__name__}")
    raw = json.loads(json.dumps(raw))  # a deep copy that we may modify
    for assignment in overrides:
        apply_override(raw, assignment)
    scenario = build(Scenario, raw)
    validate(scenario)
    return scenario


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def validate(s: Scenario) -> None:
    """Checks across fields: refuse what cannot work, before anything starts."""
    if s.task is not None and ":" not in s.task and s.task not in TASKS:
        raise ScenarioError("task", f"unknown task {s.task!r}; built in: {', '.join(sorted(TASKS))}, "
                                    "or package.module:Name")
    if s.task is not None and s.data.factory:
        raise ScenarioError("data.factory", f"the task {s.task!r} supplies its own data; a scenario names a task or a "
                                            "data factory, not both")
    if not NAME.fullmatch(s.name):
        raise ScenarioError("name", f"expected 1 to 100 letters, digits, '.', '_' or '-' (it names the run "
                                    f"folder), starting with a letter or digit; got {s.name[:60]!r}"
                                    + ("..." if len(s.name) > 60 else ""))
    for i, target in enumerate(s.targets):
        if not 0 < target <= 1:
            raise ScenarioError(f"targets[{i}]", f"expected an accuracy in (0, 1], got {target!r}")
    fl = s.fl
    if fl.min_clients > fl.clients:
        raise ScenarioError(
            "fl.min_clients", f"{fl.min_clients} is more than fl.clients ({fl.clients})"
        )
    s.kind.validate(s)
    _validate_sampling(s)
    _validate_sites(s)
    known = set(s.node_names)
    for section, names in (("network.nodes", s.network.nodes), ("compute.nodes", s.compute.nodes)):
        for name in names:
            if name not in known:
                raise ScenarioError(
                    f"{section}.{name}", f"no such node (nodes are {', '.join(s.node_names)})"
                )
    for i, window in enumerate(s.faults.offline):
        path = f"faults.offline[{i}]"
        if window.node not in known:
            raise ScenarioError(
                f"{path}.node", f"no such node {window.node!r} (nodes are {', '.join(s.node_names)})"
            )
        if window.end_s is not None and window.end_s <= window.start_s:
            raise ScenarioError(f"{path}.end_s", f"must be after start_s ({window.start_s})")
    _validate_faults(s, known)
    for name in [None, *s.compute.nodes]:
        spec = s.compute_for(name) if name else s.compute.default
        where = f"compute.nodes.{name}" if name else "compute.default"
        times = [step.at_s for step in spec.schedule]
        if times != sorted(times):
            raise ScenarioError(f"{where}.schedule", "steps must be in time order")
        if spec.varying is not None and spec.varying.high < spec.varying.low:
            raise ScenarioError(f"{where}.varying.high", f"must be >= low ({spec.varying.low})")


def _validate_sampling(s: Scenario) -> None:
    fl = s.fl
    if fl.sample is not None:
        if fl.sample >= 1 and fl.sample != int(fl.sample):
            raise ScenarioError("fl.sample", f"a count must be a whole number (a fraction is < 1), got {fl.sample!r}")
        asked = fl.asked_per_round
        if asked > fl.clients:
            raise ScenarioError("fl.sample", f"asks {asked} clients a round, more than fl.clients ({fl.clients})")
        if fl.min_clients > asked:
            raise ScenarioError("fl.min_clients", f"{fl.min_clients} is more than the {asked} clients "
                                                  "fl.sample asks per round")
    if fl.availability.kind == "trace" and not fl.availability.trace:
        raise ScenarioError("fl.availability.trace", "availability kind 'trace' needs the trace file's path")


def _validate_sites(s: Scenario) -> None:
    sites, net = s.network.sites, s.network
    if net.central is not None and net.central not in sites:
        raise ScenarioError("network.central", f"no such site {net.central!r} (sites are {', '.join(sites) or 'none'})")
    if s.kind.places_nodes_in_sites(s):
        return
    seen: dict[str, str] = {}
    for name, site in sites.items():
        for j, node in enumerate(site.nodes):
            if node not in s.node_names:
                raise ScenarioError(f"network.sites.{name}.nodes[{j}]",
                                    f"no such node {node!r} (nodes are {', '.join(s.node_names)})")
            if node in seen:
                raise ScenarioError(f"network.sites.{name}.nodes[{j}]", f"{node} is already in site {seen[node]}")
            seen[node] = name
    if sites and len(seen) != len(s.node_names):
        missing = [n for n in s.node_names if n not in seen]
        raise ScenarioError("network.sites", f"every node must be in a site; not placed: {', '.join(missing)}")


def _validate_faults(s: Scenario, known: set[str]) -> None:
    faults = s.faults
    nodes = ", ".join(s.node_names)

    def node(path: str, name: str) -> None:
        if name not in known:
            raise ScenarioError(path, f"no such node {name!r} (nodes are {nodes})")

    for i, crash in enumerate(faults.crashes):
        path = f"faults.crashes[{i}]"
        if not s.kind.crash_points:
            raise ScenarioError(path, f"crashes at protocol points are FL faults (mode {s.mode}: faults.offline)")
        node(f"{path}.node", crash.node)
        points = s.kind.crash_points["leader" if crash.node == s.node_names[0] else "member"]
        if crash.at not in points:
            raise ScenarioError(f"{path}.at", f"{crash.node} can crash at {', '.join(points)}; got {crash.at!r}")
        if crash.round > s.fl.rounds:
            raise ScenarioError(f"{path}.round", f"round {crash.round} is after the last round ({s.fl.rounds})")
    for i, part in enumerate(faults.partitions):
        path = f"faults.partitions[{i}]"
        if not part.nodes:
            raise ScenarioError(f"{path}.nodes", "name at least one node to cut off")
        for j, name in enumerate(part.nodes):
            node(f"{path}.nodes[{j}]", name)
        if len(set(part.nodes)) == len(known):
            raise ScenarioError(f"{path}.nodes", "a partition of every node cuts nothing off")
        if part.end_s <= part.start_s:
            raise ScenarioError(f"{path}.end_s", f"must be after start_s ({part.start_s})")
    for i, bad in enumerate(faults.corrupt):
        path = f"faults.corrupt[{i}]"
        node(f"{path}.node", bad.node)
        if not s.kind.takes_corrupt(s, bad.node):
            raise ScenarioError(f"{path}.node", "only FL clients send updates that can be corrupted")
        for j, r in enumerate(bad.rounds):
            if not 1 <= r <= s.fl.rounds:
                raise ScenarioError(f"{path}.rounds[{j}]", f"expected a round in 1..{s.fl.rounds}, got {r}")
