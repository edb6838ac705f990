"""How long a node's compute takes in virtual time.

The PyTorch work really runs (its result is real); the clock advances by a
model of it instead of by this machine's wall time, so that a scenario's
timeouts and stragglers are decided the same way on any machine:

    duration = samples * train_s_per_sample * slowdown * (1 + U(-jitter, +jitter))

``train_s_per_sample`` defaults to the model's reference cost (core.models),
measured on the reference machine.  Evaluation is the experimenter's
instrument, not part of the emulated system, so it takes no virtual time.
"""

from __future__ import annotations

import numpy as np

from dtemu.core.scenario import ComputeSpec


class ComputeTimer:
    def __init__(self, spec: ComputeSpec, reference_s_per_sample: float | None, seed: int):
        cost = spec.train_s_per_sample or reference_s_per_sample
        if cost is None:
            raise ValueError(
                "compute.default.train_s_per_sample must be set for a model with no reference cost"
            )
        self.s_per_sample = cost * spec.slowdown
        self.jitter = spec.jitter
        self.rng = np.random.default_rng(seed)

    def duration(self, samples: int, kind: str = "train") -> float:
        if kind != "train" or samples <= 0:
            return 0.0
        factor = 1.0 + (self.rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)
        return samples * self.s_per_sample * factor
