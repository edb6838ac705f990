"""Every mode's GPU path, run here on a stand-in GPU (tests/fake_cuda.py): the CPU's arithmetic,
with CUDA's refusals of a device's tensor handed to numpy, of host and device tensors mixed in one
operation, and of a host generator drawing into a device tensor.

A run with ``device: cuda`` on it must train the CPU's model bit for bit: the same operations, only
placed elsewhere; any tensor left behind on the host, or brought back without ``.cpu()``, fails the
run.  What the stand-in cannot show (a real GPU's arithmetic, its deterministic algorithms, its
memory) the GPU tests of tests/test_device.py show where there is one (tools/gpu_checks.sh).
"""

import json

import pytest

from fake_cuda import DeviceMixed, fake_cuda, on_device
from helpers import needs_mnist

SMALL = {"model": "small_cnn", "seed": 1, "data": {"test_samples": 300}}
SITES = {"central": "central", "sites": {s: {"lan": {"bandwidth_mbps": 1000, "latency_ms": 0.1},
                                              "wan": {"up_mbps": 155, "down_mbps": 155, "latency_ms": 1}}
                                         for s in ("central", "a", "b")}}
DDP = {"workers": 3, "epochs": 1, "batch_size": 32, "max_steps": 8, "weight_decay": 0.0001}
GEO = {"architecture": "hips", "workers_per_site": 2, "rounds": 6, "batch_size": 32, "eval_every": 3}

# One scenario for each path a mode's training takes through torch.
CASES = {
    "fl_fedprox": {"fl": {"clients": 2, "rounds": 2, "subset": 128, "algorithm": "fedprox",
                          "proximal_mu": 0.01, "momentum": 0.9}},
    "fl_esync": {"fl": {"clients": 2, "rounds": 2, "subset": 128, "algorithm": "esync"}},
    "ddp_ring": {"mode": "ddp", "ddp": {**DDP, "allreduce": "ring", "momentum": 0.9}},
    # worker2 is lost: the survivors take the leader's momentum buffers (optstate, on the device)
    "ddp_dgc_worker_lost": {"mode": "ddp", "ddp": {**DDP, "max_steps": 12, "compression": "dgc", "density": 0.01,
                                                    "momentum": 0.9, "on_worker_lost": "continue",
                                                    "min_workers": 2, "step_timeout_s": 1},
                            "faults": {"offline": [{"node": "worker2", "start_s": 0.05}]}},
    # ESync (the state server's answers follow emu's clock: the same in every run) from Xavier's weights
    "fl_esync_xavier": {"fl": {"clients": 2, "algorithm": "esync", "rounds": 3, "batch_size": 32, "init": "xavier"}},
    "geo_bisparse_fp16": {"mode": "geo", "network": SITES,
                          "geo": {**GEO, "compression": "bisparse_fp16", "momentum": 0.9}},
    # site b comes up late and is brought up to the others' model and momentum (core.geo.join)
    "geo_join": {"mode": "geo", "network": SITES, "geo": {**GEO, "rounds": 16, "joining": True, "start_wait_s": 0.05, "momentum": 0.9},
                 "faults": {"offline": [{"node": n, "start_s": 0, "end_s": 0.12} for n in ("b-ps", "b-w0", "b-w1")]}},
}


def _fake_env() -> dict:
    """What makes a Python process started with it install the stand-in (tests/fake_cuda_site)."""
    import os

    from helpers import ROOT

    site = str(ROOT / "tests" / "fake_cuda_site")
    return {"DTEMU_FAKE_CUDA": "1", "PYTHONPATH": os.pathsep.join(filter(None, (site, os.environ.get("PYTHONPATH"))))}


def _run(tmp_path, name: str, device: str) -> tuple[dict, list[dict]]:
    """An emu run of ``CASES[name]`` on ``device`` (cuda: the stand-in, this process's)."""
    import contextlib

    from dtemu.emu.cli import main

    path = tmp_path / f"{name}-{device}.json"
    path.write_text(json.dumps({"name": name, "device": device, **SMALL, **CASES[name]}))
    out = tmp_path / f"{name}-{device}"
    args = ["run", str(path), "--out", str(out), "--no-tui", "--jobs", "1"]   # (the stand-in is this process's)
    with fake_cuda() if device == "cuda" else contextlib.nullcontext():
        assert main(args) == 0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), events


@needs_mnist
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_run_on_the_gpu_trains_the_cpus_model(tmp_path, name):
    cpu, _ = _run(tmp_path, name, "cpu")
    gpu, events = _run(tmp_path, name, "cuda")
    failed = [e for e in events if "error" in e]
    assert not failed, failed[:2]   # (a role reports a step that raised; it does not end the run)
    assert (cpu["device"], gpu["device"]) == ("cpu", "cuda")
    assert gpu["model_sha256"] == cpu["model_sha256"]
    assert gpu["final_accuracy"] == cpu["final_accuracy"]
    if name == "geo_join":
        assert [e for e in events if e["kind"] == "geo_join"], "site b never joined: the test shows nothing"
    if name == "ddp_dgc_worker_lost":
        assert gpu["lost_ranks"] == [2], gpu


def test_the_stand_in_refuses_what_cuda_refuses(monkeypatch):
    import torch

    with fake_cuda():
        layer = torch.nn.Linear(3, 2).to("cuda")
        assert on_device(layer.weight) and layer.weight.device.type == "cuda" and layer.weight.is_cuda
        with pytest.raises(DeviceMixed):
            layer(torch.ones(4, 3))                      # the host's input to the device's layer
        layer(torch.ones(4, 3).cuda()).sum().backward()
        assert on_device(layer.weight.grad)
        with pytest.raises(TypeError, match="numpy"):
            layer.weight.grad.numpy()
        assert layer.weight.grad.cpu().numpy().shape == (2, 3)
        with pytest.raises(DeviceMixed, match="generator"):
            layer.weight.data.uniform_(generator=torch.Generator())
        with pytest.raises(DeviceMixed):
            layer.weight.grad = torch.zeros(2, 3)
        opt = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
        opt.step()
        assert on_device(opt.state[layer.weight]["momentum_buffer"])
        assert on_device(torch.zeros(2, device=layer.weight.device))
        layer.weight.data.copy_(torch.ones(2, 3))      # a copy crosses, as CUDA's does
        assert on_device(layer.weight.data[0]) and not on_device(layer.weight.detach().cpu())


@needs_mnist
def test_a_worker_process_runs_the_jobs_on_the_gpu_as_the_role_would(monkeypatch):
    """emu --jobs N hands a step to a worker process as a job (core.ml.jobs): there it runs on the
    worker's own copy of the model and data on the GPU (emu.pool.run_job), and comes back as the
    host's arrays (a pickled job, run in this process: the stand-in is this process's)."""
    import pickle

    import numpy as np

    from dtemu.core.ml.jobs import take_gradients
    from dtemu.core.ml.params import flatten, grads_vector
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu import pool
    from dtemu.host.work import dtemu_work

    for name, value in (("_dataset", None), ("_on_device", {}), ("_models", {})):
        monkeypatch.setattr(pool, name, value)   # (the worker's state, this test's own)
    raw = {"name": "jobs", "mode": "ddp", "device": "cuda", **SMALL, "ddp": DDP}
    with fake_cuda():
        work = dtemu_work(parse_scenario(raw))
        pool.init_worker(work.dataset, 1)
        batch = work.worker_batches(0, 0)[0]
        here, there = work.new_model(), work.new_model()
        step = work.gradient_step(here, batch, 0, 0)
        result = pool.run_job(pickle.loads(pickle.dumps(step.job)))
        assert all(isinstance(part, np.ndarray) for part in result[1:])
        assert take_gradients(there, result) == take_gradients(here, step.fn())
        assert np.array_equal(grads_vector(list(there.parameters())), grads_vector(list(here.parameters())))
        assert all(on_device(p) and on_device(p.grad) for p in there.parameters())

        evaluation = work.eval_job(flatten(here))
        assert evaluation.finish([pool.run_job(part) for part in evaluation.split(3)]) == work.evaluate(flatten(here))


@needs_mnist
def test_a_profile_timed_on_the_gpu_says_so(tmp_path, monkeypatch):
    """``emu calibrate`` of a scenario on cuda times its step there, and the profile records the device
    and the GPU: it predicts a GPU's runs, wherever emu runs them."""
    from dtemu.emu.cli import main
    from dtemu.host.profile import read_profile

    monkeypatch.setattr("dtemu.emu.calibrate._message_sets", lambda share=None, over="shm": [])   # (DDS's message costs: not the GPU's)
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "cal", "device": "cuda", **SMALL, **CASES["ddp_ring"]}))
    with fake_cuda():
        assert main(["calibrate", str(path), "--reps", "1", "--out", str(tmp_path / "p.yaml")]) == 0
    measured = read_profile(tmp_path / "p.yaml")["measured"]
    assert measured["device"] == "cuda" and measured["gpu"] == "FakeCuda (the CPU)"


# --- real mode: one process a rank, each on "its" GPU -----------------------------------------------
REAL = {
    "ddp_dgc": {"mode": "ddp", "ddp": {**DDP, "workers": 2, "compression": "dgc", "density": 0.01, "momentum": 0.9}},
    "fl": {"fl": {"clients": 2, "rounds": 2, "subset": 128, "momentum": 0.9}},
    "geo": {"mode": "geo", "network": {"sites": {"central": {}, "a": {}, "b": {}}},
            "geo": {"workers_per_site": 1, "rounds": 4, "eval_every": 2, "batch_size": 32,
                    "compression": "bisparse_fp16", "round_timeout_s": 30}},
}


@needs_mnist
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)  # (11 s each: real launch on the stand-in)
                                  for n in ("ddp_dgc", "fl", "geo")])
def test_real_launch_on_the_gpu_trains_emus_model(tmp_path, name):
    """``real launch --gpus 0`` of each mode, every rank's process on the stand-in GPU (installed as it
    starts: tests/fake_cuda_site): emu's model on the CPU, bit for bit."""
    pytest.importorskip("cyclonedds")
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu.run import run_emulation
    from helpers import real_launch, scenario_file

    raw = {"name": f"gpu_{name}", "threads": 1, **SMALL, **REAL[name]}
    code, tail = real_launch(scenario_file(tmp_path, {**raw, "device": "cuda"}), tmp_path / "real", 90.0, _fake_env(),
                             args=("--gpus", "0"))
    assert code == 0, tail
    real = json.loads((tmp_path / "real" / "summary.json").read_text())
    emu = run_emulation(parse_scenario(raw), tmp_path / "emu")
    assert real["device"] == "cuda" and real["platform"]["gpu"] == "FakeCuda (the CPU)"
    assert real["platform"]["visible_devices"] == "0" and real["platform"]["fixed"]
    assert real["model_sha256"] == emu["model_sha256"]


@needs_mnist
@pytest.mark.slow   # (16 s a case: two fresh interpreters and the fork server; the jobs themselves run in the default tests above)
@pytest.mark.parametrize("name", ["ddp_ring", "fl_esync_xavier"])
def test_emu_worker_processes_share_the_gpu(tmp_path, name):
    """``emu run --jobs 2``: the steps run in worker processes, each with the model and data on the GPU
    (the stand-in installed in every process as it starts, the fork server's included): the CPU's model."""
    import subprocess
    import sys

    from helpers import ROOT, env

    raw = {"name": name, **SMALL, **CASES[name]}
    summaries = {}
    for device, extra in (("cpu", {}), ("cuda", _fake_env())):
        path = tmp_path / f"{device}.json"
        path.write_text(json.dumps({**raw, "device": device}))
        done = subprocess.run([sys.executable, "-m", "dtemu.emu.cli", "run", str(path), "--out", str(tmp_path / device),
                               "--no-tui", "--jobs", "2" if extra else "1"], cwd=ROOT, env={**env(), **extra},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        summaries[device] = json.loads((tmp_path / device / "summary.json").read_text())
    assert summaries["cuda"]["device"] == "cuda"
    assert summaries["cuda"]["model_sha256"] == summaries["cpu"]["model_sha256"]


# --- the tasks beyond MNIST: a language model's embedding and tokens, ResNet-18's batch norm ----------
TASKS = {
    "char_lm_ddp_dgc": ("char_lm.yaml", ["ddp.max_steps=4", "data.test_samples=200"]),
    "char_lm_geo": ("char_lm.yaml", ["mode=geo", "geo.workers_per_site=1", "geo.rounds=3", "geo.eval_every=3",
                                     "network.sites={c: {}, a: {}, b: {}}", "data.test_samples=200"]),
    "resnet18_fl": ("fl_cifar10.yaml", ["fl.rounds=1", "fl.subset=8", "fl.batch_size=8", "fl.clients=2",
                                        "fl.min_clients=2", "data.partition=iid", "data.test_samples=16"]),
    "resnet18_ddp_dgc": ("fl_cifar10.yaml", ["mode=ddp", "ddp.workers=2", "ddp.batch_size=8", "ddp.max_steps=2",
                                             "ddp.compression=dgc", "ddp.momentum=0.9", "data.partition=iid",
                                             "data.test_samples=16"]),
}


@pytest.mark.parametrize("name", [*sorted(set(TASKS) - {"resnet18_ddp_dgc"}),
                                  pytest.param("resnet18_ddp_dgc", marks=pytest.mark.slow)])
@pytest.mark.filterwarnings("ignore:PyTorch was compiled without cuDNN")   # (the LSTM asks the stand-in's cuDNN)
def test_the_shipped_tasks_train_on_the_gpu_as_on_the_cpu(tmp_path, monkeypatch, name):
    from dtemu.emu.run import run_emulation
    from dtemu.host.scenario_file import load_scenario
    from helpers import ROOT
    from test_builtin_tasks import cifar_folder

    if name.startswith("resnet18"):   # (the synthetic archive, in CIFAR-10's own format)
        monkeypatch.setenv("DTEMU_DATA", str(cifar_folder(tmp_path / "data")))
    example, sets = TASKS[name]
    path = ROOT / "scenarios" / "examples" / example
    models = {"cpu": run_emulation(load_scenario(path, [*sets, "device=cpu"]), tmp_path / "cpu")["model_sha256"]}
    with fake_cuda():
        summary = run_emulation(load_scenario(path, [*sets, "device=cuda"]), tmp_path / "cuda")
    assert summary["device"] == "cuda"
    models["cuda"] = summary["model_sha256"]
    assert models["cuda"] == models["cpu"]
