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
mode then reproduces the scenario's *relative* timing.  On the testbed's machines
(``--machines``, real.machines) a trainer has a CPU share of its own, and the step
is timed alone under that share (host.cpu_shares.confined).  ``--time-scale X`` sets
the factor, ``--time-scale 1`` turns it off.
"""

from __future__ import annotations

from dtemu.core.ml.models import model_cost
from dtemu.core.scenario import Scenario
from dtemu.host import cores as host_cores
from dtemu.host.datasets import load_for
from dtemu.host.train_cost import MAX_TOGETHER, measured_s_per_sample, measured_together, sample_of


def time_scale(scenario: Scenario, cores: int | None = None, share: float | None = None) -> tuple[float, str]:
    """(factor, how it was found): at least 1, never below the scenario's own timing.  ``share``: each
    trainer has that much of a core to itself (a testbed machine's CPU share)."""
    if not scenario.kind.own_model:
        return 1.0, f"mode {scenario.mode} trains the app's own model, whose step dtemu cannot time ahead of the run"
    trainers = scenario.training_nodes
    reference = scenario.compute_for(trainers[0]).train_s_per_sample or model_cost(scenario.model_spec)
    if not reference:
        return 1.0, "no compute model to compare with (a model factory without compute.default.train_s_per_sample)"
    cores = cores or host_cores.available()
    ranks = min(len(trainers), MAX_TOGETHER)
    # a scenario's own data (a task's, a data factory's) is timed on a batch of it: any input shape
    sample = sample_of(load_for(scenario), scenario) if scenario.task or scenario.data.factory else None
    if share is not None:
        from dtemu.host.cpu_shares import confined

        with confined(share):
            here = measured_s_per_sample(scenario, sample=sample)
        how = f"alone under a CPU share of {share:g}"
    elif len(trainers) * scenario.threads > cores:  # the ranks share the cores: measure them sharing
        here = measured_together(scenario, ranks, sample)
        how = f"{ranks} ranks x {scenario.threads} threads training at once on {cores} cores"
    else:
        here = measured_s_per_sample(scenario, sample=sample)
        how = f"alone ({len(trainers)} training ranks x {scenario.threads} threads fit {cores} cores)"
    factor = max(1.0, round(here / reference, 2))
    return factor, f"one step here costs {here * 1e3:.3f} ms/sample, {how}, against the scenario's {reference * 1e3:.3f}"
