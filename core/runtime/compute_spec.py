"""The ``compute`` section of a scenario: what training and a role's other work cost each node, and
how its speed changes (core.runtime.compute applies them)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from dtemu.core.schema import check, each, non_negative, positive, probability


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
    # Emu only: how much a training job's time varies on the machine it was calibrated on, in two
    # parts (``emu calibrate`` measures both): ``spread``, what a job varies whatever its length (a
    # fraction of its mean: slow spells longer than a job), and ``spread_per_sample``, what each step
    # varies by itself and averages out over a job (a job of n samples varies by it over sqrt(n)).
    # Each job takes its modelled time times a factor drawn from a seeded stream of its own (uniform,
    # mean 1).  Real mode stages nothing: its machines vary by themselves.  0: every job alike.
    spread: float = field(default=0.0, metadata=check(non_negative))
    spread_per_sample: float = field(default=0.0, metadata=check(non_negative))
    # Seconds a node's first training steps take beyond their modelled time, step by step: a fresh
    # process's first steps hold torch's lazy set-up (``emu calibrate --together`` times them).  A
    # number: the first step's (in the node's first job).  0 or []: none.
    warmup_s: float | list[float] = field(default=0.0, metadata=check(each(non_negative)))
    # Speed that changes over time: steps that set the slowdown from a time on, and/or a random factor.
    schedule: list[SlowdownStep] = field(default_factory=list)
    varying: VaryingSlowdown | None = None
    # A client's evaluation in a federation that asks for it (a Flower app's evaluate calls): seconds per
    # example it reports, with the node's slowdown (``emu calibrate`` times a Flower app's); 0: free.
    eval_s_per_sample: float = field(default=0.0, metadata=check(non_negative))
    # A Flower app's query call (a message of type "query"): seconds each; 0: free.
    query_s: float = field(default=0.0, metadata=check(non_negative))
    # A Flower ServerApp's own work between its grid calls (its strategy's aggregation, making and
    # reading Messages, a central evaluation): seconds per MB (1e6 bytes) of the arrays it handled,
    # those of the replies it was last given and those it sends next, with the node's slowdown
    # (``emu calibrate`` times an app's); 0: free.
    app_s_per_mb: float = field(default=0.0, metadata=check(non_negative))
    # Emu only: seconds of CPU per MB (1e6 bytes) of every message a node receives (reassembly,
    # decoding, checks) before its role gets it; 0: none (real mode spends what it spends).
    decode_s_per_mb: float = field(default=0.0, metadata=check(non_negative))
    # Emu only: seconds of CPU per message sent (before it leaves: the transport's write) and per
    # message received (before its role has it: the receive thread, the hand-off), whatever its size.
    send_s_per_message: float = field(default=0.0, metadata=check(non_negative))
    recv_s_per_message: float = field(default=0.0, metadata=check(non_negative))
    # Emu only: and per MB (1e6 bytes) of it, the transport's own (framing, serializing and the
    # sockets on the sender, once a message; the receive thread's reassembly and hand-off on each
    # receiver, beyond the copy ``decode_s_per_mb`` holds).  0: free.
    send_s_per_mb: float = field(default=0.0, metadata=check(non_negative))
    recv_s_per_mb: float = field(default=0.0, metadata=check(non_negative))
    # Emu only, in a sealed run (a key): seconds of CPU per MB (1e6 bytes) of a message to seal it on
    # its sender (once, whoever it goes to) and to open it on each receiver (an HMAC over its bytes).
    seal_s_per_mb: float = field(default=0.0, metadata=check(non_negative))
    # Emu only: the CPU work outside training, priced per MB of the model (CpuCosts); all 0: free.
    cpu: CpuCosts = field(default_factory=CpuCosts)


@dataclass(frozen=True)
class ComputeOverride:
    train_s_per_sample: float | None = field(default=None, metadata=check(positive))
    slowdown: float | None = field(default=None, metadata=check(positive))
    jitter: float | None = field(default=None, metadata=check(probability))
    spread: float | None = field(default=None, metadata=check(non_negative))
    spread_per_sample: float | None = field(default=None, metadata=check(non_negative))
    warmup_s: float | list[float] | None = field(default=None, metadata=check(each(non_negative)))
    schedule: list[SlowdownStep] | None = None
    varying: VaryingSlowdown | None = None
    eval_s_per_sample: float | None = field(default=None, metadata=check(non_negative))
    query_s: float | None = field(default=None, metadata=check(non_negative))
    app_s_per_mb: float | None = field(default=None, metadata=check(non_negative))
    decode_s_per_mb: float | None = field(default=None, metadata=check(non_negative))
    send_s_per_message: float | None = field(default=None, metadata=check(non_negative))
    recv_s_per_message: float | None = field(default=None, metadata=check(non_negative))
    send_s_per_mb: float | None = field(default=None, metadata=check(non_negative))
    recv_s_per_mb: float | None = field(default=None, metadata=check(non_negative))
    seal_s_per_mb: float | None = field(default=None, metadata=check(non_negative))
    cpu: CpuCosts | None = None   # replaces the default's block as a whole


@dataclass(frozen=True)
class ComputeModel:
    default: ComputeSpec = field(default_factory=ComputeSpec)
    nodes: dict[str, ComputeOverride] = field(default_factory=dict)
    # Emu only: the nodes share this many cores for their CPU work priced per MB (``cpu`` and
    # ``decode_s_per_mb``): at most that many such jobs run at once, the others wait their turn
    # (as real ranks on one machine do); 0: every node has cores of its own.
    shared_cores: int = field(default=0, metadata=check(non_negative))
    # Emu only: which nodes share a machine's CPU (emu.machines: processor sharing of their jobs).
    # nodes: each node is a machine of its own; sites: the nodes of a site share one, as on the
    # testbed of real launch --machines (a geo site's PS beside its workers).
    machines: Literal["nodes", "sites"] = "nodes"
    # Emu only: which draw of the machines' own variation (``spread``) the run takes.  0: the seed's
    # own.  A run's timing is one draw of it: where messages cross or collide depends on it (an
    # asynchronous rule's versions), and ``emu validate --draws N`` predicts from draws 0..N-1.
    spread_draw: int = field(default=0, metadata=check(non_negative))
    # A calibration profile (``emu calibrate``) whose costs the loader applied (host.profile): its
    # path, made absolute; the values it set are in the keys above.
    profile: str | None = None
