"""A DDP worker's exchange ops, priced in emu where the scenario says (compute.*.cpu.encode_s_per_mb
for the compress, apply_s_per_mb for applying the group's gradient, per MB of the fp32 gradient;
`emu calibrate` measures both for the exchange): each step's compress_s is their cost, the model does
not change, and at the default (0) they are free."""

import json

import pytest

from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation
from helpers import needs_mnist

pytestmark = needs_mnist


def _steps(folder):
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return [e for e in events if e["kind"] == "step"]


@pytest.mark.parametrize("compression", ["none", "dgc"])
def test_pricing_the_exchange_ops_adds_their_cost_to_each_step(tmp_path, compression):
    raw = {"name": "ddp-ops", "mode": "ddp", "model": "small_cnn", "threads": 1,
           "data": {"test_samples": 200},
           "ddp": {"workers": 2, "max_steps": 3, "batch_size": 16, "compression": compression}}
    free = run_emulation(parse_scenario(raw), tmp_path / "free")
    priced = run_emulation(parse_scenario(raw, ["compute.default.cpu.encode_s_per_mb=0.01",
                                                "compute.default.cpu.apply_s_per_mb=0.02"]), tmp_path / "priced")
    assert priced["model_sha256"] == free["model_sha256"]
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params

    mb = 4 * num_params(build_model("small_cnn", 0)) / 1e6
    assert [s["compress_s"] for s in _steps(tmp_path / "free")] == [0.0] * 6
    assert [s["compress_s"] for s in _steps(tmp_path / "priced")] == pytest.approx([mb * 0.03] * 6, abs=1e-9)


def test_calibrate_measures_the_exchange_ops():
    from dtemu.emu.costs import ddp_sets

    raw = {"name": "ddp-cal", "mode": "ddp", "model": "small_cnn", "threads": 1,
           "ddp": {"workers": 3, "max_steps": 3, "compression": "dgc"}}
    sets = dict(s.split("=", 1) for s in ddp_sets(parse_scenario(raw), reps=1))
    assert float(sets["compute.default.cpu.encode_s_per_mb"]) > 0
    assert float(sets["compute.default.cpu.apply_s_per_mb"]) > 0
