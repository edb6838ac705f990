"""A run that stops on an error still leaves a summary.json that says why."""

import json

import pytest

from dtemu.core.errors import CheckpointError
from dtemu.emu.run import run_emulation
from test_fl_protocol import StandIn, scenario


def test_a_run_that_fails_to_start_writes_its_summary(tmp_path):
    with pytest.raises(CheckpointError):
        run_emulation(scenario(), tmp_path / "run", init=b"not a checkpoint", work=StandIn())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["failed"] is True and summary["stop_reason"].startswith("CheckpointError: ")
    assert summary["rounds"] == 0 and summary["model_sha256"] is None and summary["runtime"] == "emu"
