"""The ``ddp`` section of a scenario: data-parallel training's keys (core.ddp), each with its default
and what it means."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtemu.core.ddp.frames import FRAME_BYTES
from dtemu.core.schema import U16, between, check, fraction, non_negative, positive


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
