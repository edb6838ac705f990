"""How much slower this machine runs a scenario than the compute model the scenario describes.

A scenario's durations (round timeouts, fault times) are in the seconds of its
compute model (``compute.*.train_s_per_sample``, by default the model's
reference cost on the reference machine).  Five processes on two cores train
far slower than that, so a 0.8 s round timeout calibrated for the model fails
most rounds for real.  ``real launch`` therefore measures, before round 1, what
one training step of the scenario's model costs here, with the scenario's
threads, times how many training ranks share the cores, and stretches every
duration of the scenario by that factor (``core.scenario.stretched``): real
mode then reproduces the scenario's *relative* timing.  ``--time-scale X`` sets
the factor, ``--time-scale 1`` turns it off.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from dtemu.core.ml.models import build_model, model_cost
from dtemu.core.scenario import Scenario

STEPS = 8  # timed steps, after two untimed ones


def measured_s_per_sample(scenario: Scenario) -> float:
    """Seconds per training sample of the scenario's model on this machine, alone, with its threads."""
    batch = scenario.ddp.batch_size if scenario.mode == "ddp" else scenario.fl.batch_size
    model = build_model(scenario.model, seed=scenario.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    threads = torch.get_num_threads()
    torch.set_num_threads(scenario.threads)
    try:
        for i in range(STEPS + 2):
            if i == 2:
                t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - t0) / (STEPS * batch)
    finally:
        torch.set_num_threads(threads)


def time_scale(scenario: Scenario, cores: int | None = None) -> tuple[float, str]:
    """(factor, how it was found): at least 1, never below the scenario's own timing."""
    trainers = scenario.training_nodes
    reference = scenario.compute_for(trainers[0]).train_s_per_sample or model_cost(scenario.model)
    if not reference:
        return 1.0, "no compute model to compare with (a model factory without compute.default.train_s_per_sample)"
    here = measured_s_per_sample(scenario)
    cores = cores or os.cpu_count() or 1
    sharing = max(1.0, len(trainers) * scenario.threads / cores)  # ranks that train at once share the cores
    factor = max(1.0, round(here / reference * sharing, 2))
    return factor, (f"one step here costs {here * 1e3:.3f} ms/sample against the scenario's {reference * 1e3:.3f}, "
                    f"and {len(trainers)} training ranks x {scenario.threads} threads share {cores} cores")
