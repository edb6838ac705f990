"""Deep Gradient Compression's settings (core.compression.dgc): the density, its warm-up, the
momentum, clipping and which tensors travel dense; checked when made."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from torch import nn

from dtemu.core.wire.bucket import DENSE, SPARSE, Shapes, numels

PAPER_WARMUP = (0.25, 0.0625, 0.015625, 0.004)


def param_shapes(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter, in ``named_parameters`` order."""
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


@dataclass(frozen=True)
class DGCConfig:
    density: float = 0.001  # final fraction of each sparse tensor sent per step
    sample_ratio: float = 0.01  # fraction of |v| sampled to estimate the threshold
    momentum: float = 0.9
    nesterov: bool = False
    clip_norm: float | None = None  # global max norm; each rank clips to clip_norm/sqrt(N)
    weight_decay: float = 0.0
    warmup_densities: tuple[float, ...] = PAPER_WARMUP
    warmup_steps_per_stage: int = 0  # 0 = no warm-up; e.g. steps per epoch
    dense_below: int = 1024  # tensors with fewer elements are sent dense
    fp16_values: bool = False
    seed: int = 0

    def __post_init__(self):
        def fraction(name, x):
            if isinstance(x, bool) or not (isinstance(x, numbers.Real) and 0.0 < x <= 1.0):
                raise ValueError(f"{name} must be in (0, 1], got {x!r}")

        def count(name, x):
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                raise ValueError(f"{name} must be an int >= 0, got {x!r}")

        fraction("density", self.density)
        fraction("sample_ratio", self.sample_ratio)
        for d in self.warmup_densities:
            fraction("warmup density", d)
        if not (isinstance(self.momentum, numbers.Real) and 0.0 <= self.momentum < 1.0):
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        if self.clip_norm is not None and not (
            isinstance(self.clip_norm, numbers.Real) and math.isfinite(self.clip_norm) and self.clip_norm > 0
        ):
            raise ValueError(f"clip_norm must be None or > 0, got {self.clip_norm!r}")
        if not (isinstance(self.weight_decay, numbers.Real) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        count("warmup_steps_per_stage", self.warmup_steps_per_stage)
        count("dense_below", self.dense_below)
        count("seed", self.seed)

    @property
    def compresses(self) -> bool:
        """False for the dense baseline (density 1)."""
        return self.density < 1.0

    def density_at(self, step: int) -> float:
        """Density of step ``step`` (from 0): warm-up stage, or the final density.

        A warm-up stage never compresses harder than the final density.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if self.warmup_steps_per_stage:
            stage = step // self.warmup_steps_per_stage
            if stage < len(self.warmup_densities):
                return max(self.warmup_densities[stage], self.density)
        return self.density

    def kinds(self, shapes: Shapes) -> list[int]:
        """DENSE or SPARSE per tensor; fixed for the whole run."""
        return [
            SPARSE if self.compresses and n >= self.dense_below else DENSE
            for n in numels(shapes)
        ]
