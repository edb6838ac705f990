"""Real MNIST, real PyTorch, in the emulator: determinism, resume, the CLI.

Small enough for the default run: small_cnn, 2 clients, a few hundred samples
per round, 500 test samples.
"""

import json
import os
from pathlib import Path

import pytest

from dtemu.host.datasets import resolve_root
from dtemu.host.rundir import read_summary
from dtemu.core.scenario import parse_scenario
from dtemu.host.scenario_file import load_scenario
from dtemu.emu.cli import main as emu_main
from dtemu.emu.run import run_emulation
from helpers import DATA, needs_mnist

ROOT = Path(__file__).resolve().parent.parent


pytestmark = needs_mnist


@pytest.fixture(autouse=True)
def data_root(monkeypatch):
    monkeypatch.setenv("DTEMU_DATA", DATA)


TINY = {
    "name": "tiny",
    "seed": 3,
    "model": "small_cnn",
    "data": {"partition": "shards", "test_samples": 500},
    "fl": {"clients": 2, "rounds": 3, "subset": 256, "batch_size": 32, "lr": 0.05, "codec": "sq8",
           "error_feedback": True, "min_clients": 1},
    "network": {"default": {"up_mbps": 20, "down_mbps": 50, "latency_ms": 5, "loss": 0.01}},
    "compute": {"default": {"jitter": 0.2}},
}


def tiny(*overrides):
    return parse_scenario(TINY, list(overrides))


def test_same_seed_same_run_files(tmp_path):
    run_emulation(tiny(), tmp_path / "a")
    run_emulation(tiny(), tmp_path / "b")
    assert (tmp_path / "a/events.jsonl").read_bytes() == (tmp_path / "b/events.jsonl").read_bytes()
    a, b = read_summary(tmp_path / "a"), read_summary(tmp_path / "b")
    assert a.pop("wall_time_s") >= 0 and b.pop("wall_time_s") >= 0
    assert a == b
    assert a["rounds"] == 3 and a["final_accuracy"] > 0.3  # it learns, even from 3 x 256 samples


def test_other_seed_other_model(tmp_path):
    a = run_emulation(tiny(), tmp_path / "a")
    b = run_emulation(tiny("seed=4"), tmp_path / "b")
    assert a["model_sha256"] != b["model_sha256"]


def test_resume_gives_the_uninterrupted_model(tmp_path):
    full = run_emulation(tiny("fl.error_feedback=false"), tmp_path / "full")
    run_emulation(tiny("fl.error_feedback=false", "fl.rounds=1"), tmp_path / "part")
    init = (tmp_path / "part" / "checkpoint.dtck").read_bytes()
    resumed = run_emulation(tiny("fl.error_feedback=false"), tmp_path / "resumed", init=init)
    assert resumed["model_sha256"] == full["model_sha256"]
    assert resumed["rounds"] == full["rounds"] == 3


def test_cli_writes_the_run_folder(tmp_path, capsys):
    scenario = tmp_path / "s.json"  # JSON is YAML
    scenario.write_text(json.dumps(TINY))
    out = tmp_path / "run"
    assert emu_main(["run", str(scenario), "--no-tui", "--out", str(out), "--set", "fl.rounds=1"]) == 0
    summary = read_summary(out)
    for key in ("final_accuracy", "bytes_up", "bytes_down", "model_sha256", "time_s", "wall_time_s", "rounds"):
        assert key in summary
    assert (out / "checkpoint.dtck").exists() and (out / "scenario.json").exists()
    assert "tiny: 1 rounds" in capsys.readouterr().out


def test_cli_refuses_a_bad_scenario(tmp_path, capsys):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(TINY))
    assert emu_main(["run", str(scenario), "--no-tui", "--set", "fl.codec=int8"]) == 2
    assert "fl.codec: expected one of fp32, q8, s4, sq8, got 'int8'" in capsys.readouterr().err


def test_cli_reports_a_bad_checkpoint(tmp_path, capsys):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(TINY))
    bad = tmp_path / "bad.dtck"
    bad.write_bytes(b"DTCK\x01\x00\x00\x00garbage")
    rc = emu_main(["run", str(scenario), "--no-tui", "--out", str(tmp_path / "r"), "--set", f"fl.init_path={bad}"])
    err = capsys.readouterr().err
    # a file the scenario names that is not a checkpoint: refused before anything starts, naming key and file
    assert rc == 2 and "fl.init_path" in err and str(bad) in err and not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fl_straggler", "fl_faults"])
def test_shipped_scenario_runs(tmp_path, name):
    from dtemu.report.audit import audit

    summary = run_emulation(load_scenario(ROOT / "scenarios" / f"{name}.yaml"), tmp_path / name)
    assert summary["rounds"] > 0 and summary["final_accuracy"] > 0.8
    assert audit(tmp_path / name)["lost_data"] == 0


def test_data_root_comes_from_the_environment():
    assert resolve_root(None) == Path(os.environ["DTEMU_DATA"])


def test_jobs_place_every_modes_training(tmp_path, capsys):
    """--jobs places the training of every mode: an FL client's local steps and a ddp worker's
    gradients go to the pool, and neither run says it trains in this process."""
    path = tmp_path / "s.yaml"
    path.write_text("name: fl-jobs\nmode: fl\nmodel: small_cnn\nfl: {clients: 2, rounds: 1, subset: 32}\n"
                    "data: {test_samples: 100}\n")
    assert emu_main(["run", str(path), "--no-tui", "--jobs", "2", "--out", str(tmp_path / "run")]) == 0
    assert "trains inside this process" not in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["emu"]["executor"]["jobs"] == 2
    path.write_text("name: ddp-jobs\nmode: ddp\nmodel: small_cnn\nddp: {workers: 2, max_steps: 1, batch_size: 8}\n"
                    "data: {test_samples: 100}\n")
    assert emu_main(["run", str(path), "--no-tui", "--jobs", "2", "--out", str(tmp_path / "ddp")]) == 0
    assert "trains inside this process" not in capsys.readouterr().err
    assert json.loads((tmp_path / "ddp" / "summary.json").read_text())["emu"]["executor"]["jobs"] == 2
