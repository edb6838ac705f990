"""The scenario's device: cuda is refused at load where it cannot be had (exit 2, the key named), never
run on the CPU instead; auto trains on the CPU here; summary.json says where a run trained."""

import json

import pytest

from dtemu.core.scenario import parse_scenario
from helpers import needs_mnist


def _torch_sees_a_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


# (these two are about a machine without a GPU; on one, or under tests/fake_cuda.py's stand-in, they skip)
no_gpu_here = pytest.mark.skipif(_torch_sees_a_gpu(), reason="torch sees a GPU here; this checks a machine without one")


@no_gpu_here
def test_cuda_is_refused_at_load_with_exit_2_and_no_run_folder(tmp_path, capsys):
    from dtemu.emu.cli import main

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "gpu", "device": "cuda", "fl": {"clients": 2, "rounds": 1}}))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-tui"]) == 2
    err = capsys.readouterr().err
    assert "device: cuda" in err and ("torch sees none" in err or "CPU only" in err)
    assert not (tmp_path / "run").exists()


@no_gpu_here
def test_auto_trains_on_the_cpu_and_the_summary_says_so(tmp_path):
    from dtemu.host.devices import resolve

    raw = {"name": "auto", "device": "auto", "fl": {"clients": 2, "rounds": 1}}
    from dtemu.core.runtime.summary import failed_summary

    assert resolve(parse_scenario(raw)) == "cpu"
    assert failed_summary(parse_scenario(raw), "emu", ValueError("x"), wall_time_s=0.0)["device"] == "cpu"
    # the key at its default keeps the scenario's digest (checkpoints from before it still resume)
    assert parse_scenario({**raw, "device": "cpu"}).digest() == parse_scenario({"name": "auto", "fl": raw["fl"]}).digest()


@pytest.mark.parametrize("value", ["gpu", "CUDA", 0])
def test_an_unknown_device_is_a_scenario_error(value):
    from dtemu.core.errors import ScenarioError

    with pytest.raises(ScenarioError, match="device"):
        parse_scenario({"name": "x", "device": value})


# --- where a GPU would be: the choice, made with torch told it has one ---------------------------

FLOWER = {"mode": "flower", "flower": {"app_dir": "scenarios/examples/flower_quickstart"}, "fl": {"clients": 2}}


@pytest.mark.parametrize("mode_raw, asked, expected", [
    ({"fl": {"clients": 2}}, "cuda", "cuda"),
    ({"fl": {"clients": 2}}, "auto", "cuda"),
    ({"mode": "ddp", "ddp": {"workers": 2}}, "cuda", "cuda"),
    ({"mode": "ps", "ps": {"workers": 2}}, "auto", "cuda"),
    ({"mode": "geo", "network": {"sites": {"central": {}, "a": {}}}}, "auto", "cuda"),
    (FLOWER, "auto", "cpu"),   # (a Flower app's code places its own tensors)
])
def test_a_gpu_is_chosen_where_the_mode_trains_on_one(monkeypatch, mode_raw, asked, expected):
    import torch

    from dtemu.host.devices import resolve

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve(parse_scenario({"name": "g", "device": asked, **mode_raw})) == expected


def test_cuda_for_a_flower_app_is_refused_by_name(monkeypatch):
    import torch

    from dtemu.core.errors import ScenarioError
    from dtemu.host.devices import resolve

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ScenarioError, match="in mode flower the training is the app's own code"):
        resolve(parse_scenario({"name": "g", "device": "cuda", **FLOWER}))


def test_the_cpu_keeps_its_tensors_and_the_workload_its_data():
    import torch

    from dtemu.core.ml.data import Dataset
    from dtemu.core.ml.workload import Workload

    data = Dataset("d", torch.zeros(4, 1, 28, 28), torch.zeros(4, dtype=torch.int64), torch.zeros(2, 1, 28, 28),
                   torch.zeros(2, dtype=torch.int64))
    assert data.to("cpu") is data
    work = Workload(parse_scenario({"name": "w", "model": "small_cnn", "fl": {"clients": 2}}), data)
    assert work.device == "cpu" and work.data is data and work.eval_job(work.initial_weights).device == "cpu"


# --- on a GPU (skipped where torch sees none) ----------------------------------------------------

def _gpu():
    import torch

    return torch.cuda.is_available()


gpu_only = pytest.mark.skipif(not _gpu(), reason="no GPU here (torch.cuda.is_available() is False)")


@gpu_only
def test_steps_one_at_a_time_on_a_gpu_give_the_bits_of_training_at_once():
    import numpy as np
    import torch
    from torch import nn

    from dtemu.core.ml.params import flatten
    from dtemu.host.devices import prepare
    from dtemu.core.ml.train import LocalTraining, train_local

    prepare("cuda")

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3)).to("cuda")

    x, y = torch.randn(50, 5, device="cuda"), torch.randint(0, 3, (50,), device="cuda")
    idx = np.arange(3, 50, 2)
    once = model()
    result = train_local(once, x, y, idx, epochs=2, batch_size=7, lr=0.1, momentum=0.5, seed=11)
    steps = LocalTraining(model(), x, y, idx, batch_size=7, lr=0.1, momentum=0.5, seed=11)
    for _ in range(8):
        steps.run(1)
    assert np.array_equal(steps.weights(), flatten(once)) and steps.result() == result


@gpu_only
@needs_mnist
@pytest.mark.parametrize("algorithm", ["fedavg", "esync"])
def test_an_fl_run_on_a_gpu_trains_the_same_model_twice(tmp_path, algorithm):
    from dtemu.emu.run import run_emulation

    raw = {"name": "gpu", "device": "cuda", "model": "small_cnn", "data": {"dataset": "mnist", "test_samples": 500},
           "fl": {"clients": 3, "rounds": 2, "subset": 256, "algorithm": algorithm}}
    a = run_emulation(parse_scenario(raw), tmp_path / "a")
    b = run_emulation(parse_scenario(raw), tmp_path / "b")
    assert a["device"] == "cuda" and a["platform"]["gpu"]
    assert a["model_sha256"] == b["model_sha256"] and a["rounds"] == 2


@gpu_only
@needs_mnist
@pytest.mark.parametrize("name", ["ddp_ring", "ddp_dgc_worker_lost", "fl_esync_xavier", "geo_bisparse_fp16",
                                  "geo_join"])
def test_every_mode_trains_the_same_model_twice_on_a_gpu(tmp_path, name):
    """ddp (dense and DGC, a worker lost), FL's ESync and geo (BiSparse, a site joining) on the GPU: the same
    model again (tests/test_fake_gpu.py runs the same scenarios on a stand-in GPU everywhere)."""
    from dtemu.emu.run import run_emulation
    from test_fake_gpu import CASES, SMALL

    raw = {"name": name, "device": "cuda", **SMALL, **CASES[name]}
    a = run_emulation(parse_scenario(raw), tmp_path / "a")
    b = run_emulation(parse_scenario(raw), tmp_path / "b")
    assert a["device"] == "cuda" and a["platform"]["gpu"]
    assert a["model_sha256"] == b["model_sha256"] and a["final_accuracy"] == b["final_accuracy"]
