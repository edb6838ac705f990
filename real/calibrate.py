"""How much slower this machine runs a scenario than the compute model the scenario describes.

A scenario's durations (round timeouts, fault times) are in the seconds of its
compute model (``compute.*.train_s_per_sample``, by default the model's
reference cost on the reference machine).  Five processes on two cores train
far slower than that, so a 0.8 s round timeout calibrated for the model fails
most rounds for real.  ``real launch`` therefore measures, before round 1, what
one training step of the scenario's model costs here, with the scenario's
threads (and, when the training ranks share the cores, with as many processes
training at once as the launch will run: oversubscribed threads cost far more
than their share of the cores), and stretches every
duration of the scenario by that factor (``core.scenario.stretched``): real
mode then reproduces the scenario's *relative* timing.  ``--time-scale X`` sets
the factor, ``--time-scale 1`` turns it off.
"""

from __future__ import annotations

import multiprocessing
import time

import torch
import torch.nn.functional as F

from dtemu.core.ml.models import build_model, model_cost
from dtemu.core.ml.sgd import SGD
from dtemu.core.ml.train import steps_with_torch_optim
from dtemu.core.scenario import Scenario
from dtemu.host import cores as host_cores

STEPS = 8  # timed steps, after two untimed ones
MAX_TOGETHER = 16  # processes measured at once (more ranks than this share the cores alike)
TOGETHER_TIMEOUT_S = 120.0


def measured_s_per_sample(scenario: Scenario, barrier=None, steps: int = STEPS) -> float:
    """Seconds per training sample of the scenario's model on this machine, with its threads
    (``barrier``: wait there after the untimed steps, so that processes measured together overlap)."""
    batch = scenario.kind.batch_size(scenario)
    model = build_model(scenario.model, seed=scenario.seed)
    # the optimizer its training nodes step with
    opt = (torch.optim.SGD if steps_with_torch_optim(scenario) else SGD)(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    threads = torch.get_num_threads()
    torch.set_num_threads(scenario.threads)
    try:
        for i in range(steps + 2):
            if i == 2:
                if barrier is not None:
                    barrier.wait(timeout=TOGETHER_TIMEOUT_S)
                t0 = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - t0) / (steps * batch)
    finally:
        torch.set_num_threads(threads)


def _timed_together(scenario: Scenario, barrier, results) -> None:
    """One of several processes that train at once (a child of ``measured_together``)."""
    torch.set_num_threads(scenario.threads)
    results.put(measured_s_per_sample(scenario, barrier, steps=3 * STEPS))


def measured_together(scenario: Scenario, ranks: int) -> float:
    """Seconds per training sample when ``ranks`` processes train at once, as a launch's do (median).

    Oversubscribed cores cost more than their share: eight torch threads on two cores spin and
    wait for one another, so four ranks of two threads each train ten times slower or worse, not
    four.  Only measuring it says how much."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=_timed_together, args=(scenario, barrier, results), daemon=True)
             for _ in range(ranks)]
    for p in procs:
        p.start()
    try:
        costs = sorted(results.get(timeout=TOGETHER_TIMEOUT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return costs[len(costs) // 2]


def time_scale(scenario: Scenario, cores: int | None = None) -> tuple[float, str]:
    """(factor, how it was found): at least 1, never below the scenario's own timing."""
    trainers = scenario.training_nodes
    reference = scenario.compute_for(trainers[0]).train_s_per_sample or model_cost(scenario.model)
    if not reference:
        return 1.0, "no compute model to compare with (a model factory without compute.default.train_s_per_sample)"
    cores = cores or host_cores.available()
    ranks = min(len(trainers), MAX_TOGETHER)
    if len(trainers) * scenario.threads > cores:  # the ranks share the cores: measure them sharing
        here = measured_together(scenario, ranks)
        how = f"{ranks} ranks x {scenario.threads} threads training at once on {cores} cores"
    else:
        here = measured_s_per_sample(scenario)
        how = f"alone ({len(trainers)} training ranks x {scenario.threads} threads fit {cores} cores)"
    factor = max(1.0, round(here / reference, 2))
    return factor, f"one step here costs {here * 1e3:.3f} ms/sample, {how}, against the scenario's {reference * 1e3:.3f}"
