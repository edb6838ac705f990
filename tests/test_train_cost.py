"""host.train_cost times a scenario's step alone and with other processes at once; a process that
dies while timing is an error at once, not a two-minute wait."""

import time

import pytest
import torch

from dtemu.core.scenario import parse_scenario
from dtemu.host.train_cost import measured_together


def test_a_process_that_dies_while_timing_together_is_an_error_at_once():
    scenario = parse_scenario({"name": "t", "model": "small_cnn", "fl": {"clients": 2, "batch_size": 4}})
    wrong = (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))   # no image: the model refuses it
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="died"):
        measured_together(scenario, 2, sample=wrong)
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("mode, section, passes", [("ddp", {"ddp": {"workers": 2, "batch_size": 4}}, True),
                                                   ("fl", {"fl": {"clients": 2, "batch_size": 4}}, False)])
def test_the_step_timed_is_the_unit_the_modes_roles_run(monkeypatch, mode, section, passes):
    """A ddp or geo worker's compute is its gradient pass (its update is priced apart); fl's is a step with
    the optimizer.  The calibration times that unit, not one for all."""
    import dtemu.host.train_cost as train_cost
    from dtemu.core.ml import train

    calls = []
    monkeypatch.setattr(train_cost, "compute_gradients",
                        lambda *a, **kw: calls.append(1) or train.compute_gradients(*a, **kw))
    scenario = parse_scenario({"name": "t", "mode": mode, "model": "small_cnn", **section})
    assert scenario.kind.compute_unit == ("gradients" if passes else "step")
    assert train_cost.measured_s_per_sample(scenario, steps=2) > 0
    assert len(calls) == (2 + train_cost.WARM_STEPS if passes else 0)
