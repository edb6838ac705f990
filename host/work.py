"""What a run's roles work on, loaded for either runtime: the mode says what (core.modes: ``Mode.work``,
a "module:function" of host), so neither runtime needs to know."""

from __future__ import annotations

from dtemu.host.resolve import resolve


def load_work(scenario):
    """The mode's work for ``scenario``; ScenarioError if it cannot be had (before a run folder exists)."""
    return resolve(scenario.kind.work)(scenario)


def dtemu_work(scenario):
    """dtemu's own learning task: the model, its data split among the training nodes."""
    from dtemu.core.ml.workload import Workload
    from dtemu.host import devices
    from dtemu.host.datasets import load_for

    device = devices.resolve(scenario)
    devices.prepare(device)
    return Workload(scenario, load_for(scenario), device)
