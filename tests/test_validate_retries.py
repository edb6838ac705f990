"""emu validate runs a repetition again where its monitors call the testbed unfaithful (--retries),
keeping what the unfaithful attempt measured beside the record and its folder as real-<i>-unfaithful-<k>.
The testbed, the calibration and the probe are stood in for: this is the loop's bookkeeping."""

import json
from types import SimpleNamespace

import pytest

from dtemu.emu import validate


@pytest.fixture
def testbed(monkeypatch):
    """A stand-in testbed whose runs are faithful as ``verdicts`` says, one after the other."""
    state = SimpleNamespace(verdicts=[], launches=0, predictions=[], followed=[], compared=[])

    def run(cmd, log, timeout_s, check=True):
        out = cmd[cmd.index("--out") + 1]
        from pathlib import Path

        Path(out).mkdir(parents=True, exist_ok=True)
        Path(log).write_text("log")
        if "launch" in cmd:
            state.launches += 1
        else:
            draw = [a.split("=")[1] for a in cmd if a.startswith("compute.spread_draw=")]
            state.predictions.append((Path(cmd[cmd.index("--profile") + 1]).name, Path(out).name, *draw))
        return 0

    def compare(scenario, real, emu):
        state.compared.append([e.name for e in emu])
        faithful = state.verdicts.pop(0)
        return {"faithful": faithful, "testbed_why": [] if faithful else ["steal 14%"], "time_error": 0.01,
                "comm_error": 0.02, "errors_within_targets": True, "within_targets": faithful, "warnings": [],
                "unit": "round", "units": 3, "same_model": True}

    monkeypatch.setattr(validate, "_run", run)
    monkeypatch.setattr(validate, "_calibrate", lambda *a, **k: None)
    def follow(scenario, args, share, profile, to):
        state.followed.append(to.name)
        return 1.05

    monkeypatch.setattr(validate, "_follow_host", follow)
    monkeypatch.setattr(validate, "table", lambda records: "")
    monkeypatch.setattr("dtemu.emu.fidelity.compare", compare)
    monkeypatch.setattr("dtemu.emu.speed_probe.probe", lambda: {"compute": 0.016, "memory": 0.021})
    monkeypatch.setattr("dtemu.host.testbed_check.unavailable", lambda: None)
    monkeypatch.setattr("dtemu.host.cpu_shares.sweep", lambda: None)
    return state


def _validate(tmp_path, *extra):
    import argparse

    p = argparse.ArgumentParser()
    validate.add_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["validate", "scenarios/fl_codecs.yaml", "--out", str(tmp_path / "v"), "--repeat", "2",
                         "--set", "fl.clients=2", *extra])
    assert validate.main(args) == 0
    return json.loads((tmp_path / "v" / "validation.json").read_text())


def test_an_unfaithful_run_runs_again_and_its_attempt_is_kept(tmp_path, testbed):
    testbed.verdicts = [False, True, True]
    records = _validate(tmp_path)
    assert testbed.launches == 3 and [r["faithful"] for r in records] == [True, True]
    assert records[0]["unfaithful_attempts"] == [{"folder": "real-1-unfaithful-1", "testbed_why": ["steal 14%"],
                                                  "time_error": 0.01, "comm_error": 0.02}]
    assert records[1]["unfaithful_attempts"] == []
    assert (tmp_path / "v" / "real-1-unfaithful-1").is_dir() and (tmp_path / "v" / "real-1-unfaithful-1.log").is_file()
    assert (tmp_path / "v" / "real-1").is_dir()


def test_retries_end_and_the_last_attempt_stands_unfaithful(tmp_path, testbed):
    testbed.verdicts = [False, True]
    records = _validate(tmp_path, "--retries", "0")
    assert testbed.launches == 2 and [r["faithful"] for r in records] == [False, True]
    assert records[0]["unfaithful_attempts"] == [] and not records[0]["within_targets"]


def test_each_run_the_first_too_is_predicted_again_at_the_hosts_speed(tmp_path, testbed):
    """A calibration takes minutes, and the host's speed moves in them: every run is predicted from the
    step timed just before it, the first too (the calibration's own prediction is not needed)."""
    testbed.verdicts = [True, True]
    records = _validate(tmp_path, "--draws", "1")
    assert testbed.followed == ["profile-1.yaml", "profile-2.yaml"]
    assert testbed.predictions == [("profile-1.yaml", "emu-1"), ("profile-2.yaml", "emu-2")]
    assert [(r["emu"], r["host_factor"]) for r in records] == [("emu-1", 1.05), ("emu-2", 1.05)]


def test_each_prediction_is_several_draws_of_emus_timing_compared_together(tmp_path, testbed):
    """A run's timing is one draw of its machines' variation (compute.spread_draw): each prediction
    is the seed's own draw and the next ones beside it, each of the same profile, and the comparison
    takes them all (emu.fidelity: each unit's mean, and their band)."""
    testbed.verdicts = [True, True]
    records = _validate(tmp_path, "--draws", "3")
    assert testbed.predictions == [("profile-1.yaml", "emu-1"), ("profile-1.yaml", "emu-1-draw1", "1"),
                                   ("profile-1.yaml", "emu-1-draw2", "2"), ("profile-2.yaml", "emu-2"),
                                   ("profile-2.yaml", "emu-2-draw1", "1"), ("profile-2.yaml", "emu-2-draw2", "2")]
    assert testbed.compared == [["emu-1", "emu-1-draw1", "emu-1-draw2"], ["emu-2", "emu-2-draw1", "emu-2-draw2"]]
    assert [r["emu_draws"] for r in records] == testbed.compared
    # the default: five draws
    testbed.verdicts, testbed.compared = [True, True], []
    _validate(tmp_path)
    assert [len(c) for c in testbed.compared] == [5, 5]


def test_no_draws_is_refused(tmp_path, testbed, capsys):
    import argparse

    p = argparse.ArgumentParser()
    validate.add_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["validate", "scenarios/fl_codecs.yaml", "--out", str(tmp_path / "v"), "--draws", "0"])
    assert validate.main(args) == 2
    assert "--draws must be at least 1" in capsys.readouterr().err


def test_host_speed_once_predicts_every_run_from_the_calibration(tmp_path, testbed):
    testbed.verdicts = [True, True]
    records = _validate(tmp_path, "--host-speed", "once", "--draws", "1")
    assert testbed.followed == [] and testbed.predictions == [("profile.yaml", "emu")]
    assert [r["emu"] for r in records] == ["emu", "emu"]


def test_a_run_whose_host_speed_cannot_be_timed_is_predicted_as_calibrated_and_says_so(tmp_path, testbed,
                                                                                       monkeypatch):
    """The timing before a run failed (ten processes at 0.145 of a core gave no result in time once):
    the run goes on, predicted from the calibration, with a warning in its record; the validation is
    not lost."""
    def fails(*a):
        raise RuntimeError("the processes timing the step together gave 0 of 10 results in 120 s")

    monkeypatch.setattr(validate, "_follow_host", fails)
    testbed.verdicts = [True, True]
    records = _validate(tmp_path, "--draws", "1")
    assert [(r["emu"], r["host_factor"]) for r in records] == [("emu", 1.0), ("emu", 1.0)]
    assert records[0]["warnings"][0].startswith("run 1: the host's speed could not be timed again")
    assert records[1]["warnings"][0].startswith("run 2: the host's speed could not be timed again")
    assert testbed.predictions == [("profile.yaml", "emu")]


def test_processes_timed_together_wait_as_long_as_their_share_makes_them():
    from dtemu.host.train_cost import TOGETHER_TIMEOUT_S, together_timeout_s

    assert together_timeout_s(None) == together_timeout_s(1.5) == TOGETHER_TIMEOUT_S
    assert together_timeout_s(0.25) == pytest.approx(4 * TOGETHER_TIMEOUT_S)


def test_a_scenario_whose_sites_are_machines_says_its_lan_is_not_validated(tmp_path, testbed):
    """A geo site is one testbed machine: its nodes reach each other over loopback, and emu models that,
    so the scenario's LAN rates are not what a record compares; each record says so, an FL one not."""
    import argparse

    testbed.verdicts = [True, True, True]
    assert not any(r["warnings"] for r in _validate(tmp_path, "--draws", "1"))
    p = argparse.ArgumentParser()
    validate.add_parser(p.add_subparsers(dest="command"))
    assert validate.main(p.parse_args(["validate", "scenarios/geo_hips.yaml", "--out", str(tmp_path / "g"),
                                       "--repeat", "1", "--draws", "1"])) == 0
    [record] = json.loads((tmp_path / "g" / "validation.json").read_text())
    assert record["warnings"] == [
        "central, a, b: one machine each on the testbed, whose nodes reach each other over its loopback, "
        "not the scenario's LAN (emu models the same): the LAN's rates are not validated"]
