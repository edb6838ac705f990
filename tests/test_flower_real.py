"""Flower apps for real: ``real launch`` runs the same scenario over DDS, one process per node, and
ends with emu's model.  Needs the extra dtemu[flower] (and, for the example, the MNIST archives)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is an optional extra: pip install 'dtemu[flower]'")

from dtemu.core.scenario import parse_scenario  # noqa: E402
from dtemu.emu.run import run_emulation  # noqa: E402
from dtemu.report.audit import audit  # noqa: E402

from helpers import needs_mnist, real_launch, scenario_file  # noqa: E402
from test_flower import toy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_a_flower_app_launched_for_real_ends_with_emus_model_despite_a_clientapp_that_raises(tmp_path):
    raw = toy({"bad": "raise", "bad-client": 1, "bad-round": 1}, fl={"round_timeout_s": 20.0})
    emu = run_emulation(parse_scenario(raw), tmp_path / "emu")
    code, tail = real_launch(scenario_file(tmp_path, raw), tmp_path / "real", timeout=90)
    assert code == 0, tail
    real = _summary(tmp_path / "real")
    assert real["model_sha256"] == emu["model_sha256"] and real["rounds"] == 2
    assert real["updates"] == emu["updates"] == {"accepted": 5, "client_error": 1, "evaluated": 6}
    assert audit(tmp_path / "real")["problems"] == []


@needs_mnist
@pytest.mark.slow  # (the default run keeps under 10 minutes on 2 cores; issue 45)
def test_the_shipped_example_runs_in_emu_with_a_client_offline_and_for_real(tmp_path):
    from dtemu.host.scenario_file import load_scenario

    small = ["fl.clients=3", "flower.run_config.num-server-rounds=2", "flower.run_config.samples-per-client=200",
             "flower.run_config.test-samples=200", "fl.round_timeout_s=30"]
    path = ROOT / "scenarios/examples/flower_quickstart.yaml"
    emu = run_emulation(load_scenario(path, small), tmp_path / "emu")
    assert emu["rounds"] == 2 and emu["final_accuracy"] > 0.1
    offline = load_scenario(path, [*small, "fl.barrier_require=min_clients", "fl.barrier_timeout_s=0.1",
                                   'faults.offline=[{"node": "client2", "start_s": 0, "end_s": 1}]'])
    missed = run_emulation(offline, tmp_path / "offline")
    assert missed["rounds"] == 2 and missed["updates"]["accepted"] == 5  # client2 missed round 1 only
    assert audit(tmp_path / "offline")["problems"] == []
    raw = {**load_scenario(path, small).to_dict()}
    raw["flower"]["app_dir"] = str(ROOT / raw["flower"]["app_dir"])
    code, tail = real_launch(scenario_file(tmp_path, raw), tmp_path / "real", timeout=120)
    assert code == 0, tail
    real = _summary(tmp_path / "real")
    assert real["model_sha256"] == emu["model_sha256"] and real["final_accuracy"] == emu["final_accuracy"]


def test_the_pytorch_fedadam_app_for_real_ends_with_emus_model(tmp_path):
    """The issue's FedAdam app (tests/flower_torch_app.py) over DDS, one process per node: every reply
    used in 3 rounds, and emu's model."""
    raw = {"name": "fedadam_torch", "mode": "flower", "seed": 3,
           "flower": {"server_app": "tests.flower_torch_app:server", "client_app": "tests.flower_torch_app:client",
                      "run_config": {"num-server-rounds": 3}},
           "fl": {"clients": 3, "round_timeout_s": 30.0}, "compute": {"default": {"train_s_per_sample": 0.001}}}
    emu = run_emulation(parse_scenario(raw), tmp_path / "emu")
    code, tail = real_launch(scenario_file(tmp_path, raw), tmp_path / "real", timeout=120)
    assert code == 0, tail
    real = _summary(tmp_path / "real")
    assert real["updates"] == emu["updates"] == {"accepted": 9, "evaluated": 9}
    assert real["model_sha256"] == emu["model_sha256"] and real["rounds"] == 3
