"""The scenario's device: cuda is refused at load where it cannot be had (exit 2, the key named), never
run on the CPU instead; auto trains on the CPU here; summary.json says where a run trained."""

import json

import pytest

from dtemu.core.scenario import parse_scenario


def test_cuda_is_refused_at_load_with_exit_2_and_no_run_folder(tmp_path, capsys):
    from dtemu.emu.cli import main

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "gpu", "device": "cuda", "fl": {"clients": 2, "rounds": 1}}))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--no-tui"]) == 2
    err = capsys.readouterr().err
    assert "device: cuda" in err and ("torch sees none" in err or "CPU only" in err)
    assert not (tmp_path / "run").exists()


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
