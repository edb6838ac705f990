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
