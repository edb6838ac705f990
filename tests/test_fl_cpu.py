"""An FL client's codec encoding, priced in emu where the scenario says (compute.*.cpu.encode_s_per_mb,
which `emu calibrate` measures): the upload starts that much later; the model does not change; at the
default (0) nothing moves."""

import json

import pytest

from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation
from helpers import needs_mnist

pytestmark = needs_mnist


def _uploads(folder):
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return {(e["node"], e["round"]): e["t"] for e in events if e["kind"] == "upload_start"}


@pytest.mark.parametrize("codec", ["fp32", "q8"])
def test_pricing_the_encoding_delays_each_upload_by_its_cost(tmp_path, codec):
    raw = {"name": "enc", "model": "small_cnn", "fl": {"clients": 2, "rounds": 2, "subset": 64, "codec": codec}}
    free = run_emulation(parse_scenario(raw), tmp_path / "free")
    cost = 0.02  # s per MB of the fp32 delta
    priced = run_emulation(parse_scenario(raw, [f"compute.default.cpu.encode_s_per_mb={cost}"]), tmp_path / "priced")
    assert priced["model_sha256"] == free["model_sha256"]
    a, b = _uploads(tmp_path / "free"), _uploads(tmp_path / "priced")
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params

    delay = 4 * num_params(build_model("small_cnn", 0)) * cost / 1e6
    first = [("client1", 1), ("client2", 1)]
    assert [b[k] - a[k] for k in first] == pytest.approx([delay, delay], abs=1e-9)


def _times(folder, kind):
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return {e["round"]: e["t"] for e in events if e["kind"] == kind and e["node"] == "controller"}


@pytest.mark.parametrize("algorithm", ["fedavg", "fedasync"])
def test_pricing_the_controllers_own_work_charges_its_aggregation_and_checkpoint(tmp_path, algorithm):
    """The rule's aggregation costs ``sum`` per MB of the updates it takes, a checkpoint ``encode`` per MB
    of the model (the controller's rates, emu.federation_costs.fl_server_costs): each lands that much after the
    round closes; the model is the same."""
    raw = {"name": "srv", "model": "small_cnn", "fl": {"clients": 2, "rounds": 2, "subset": 64, "algorithm": algorithm}}
    free = run_emulation(parse_scenario(raw), tmp_path / "free")
    rates = {"sum": 0.03, "encode": 0.05}  # s per MB
    priced = run_emulation(parse_scenario(raw, [f"compute.nodes.controller.cpu.{op}_s_per_mb={v}"
                                                for op, v in rates.items()]), tmp_path / "priced")
    assert priced["model_sha256"] == free["model_sha256"]
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params

    mb = 4 * num_params(build_model("small_cnn", 0)) / 1e6
    updates = 1 if algorithm == "fedasync" else 2
    closed, aggregated, saved = (_times(tmp_path / "priced", k) for k in ("round_close", "aggregated", "checkpoint"))
    assert aggregated[1] - closed[1] == pytest.approx(updates * mb * rates["sum"], abs=1e-9)
    assert saved[1] - aggregated[1] == pytest.approx(mb * rates["encode"], abs=1e-9)
    # unpriced, the controller's work takes no time, as before
    assert _times(tmp_path / "free", "checkpoint")[1] == _times(tmp_path / "free", "round_close")[1]
