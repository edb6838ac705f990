"""emu.speed_probe and emu.fidelity.note_host: each run's record holds how far the host's own speed
moved from the calibration's around it, with a warning past the probe's limits (emu validate probes
after calibrating and after each run); recorded, not judged (notebook entry 37)."""

import pytest

from dtemu.emu.fidelity import note_host
from dtemu.emu.speed_probe import LIMITS, moved, past_limits, probe


def _record(**kw):
    return {"faithful": True, "testbed_why": [], "errors_within_targets": True, "within_targets": True, **kw}


def test_the_probe_times_both_halves_of_its_own_workload():
    p = probe()
    assert set(p) == set(LIMITS) and all(0 < v < 5 for v in p.values())


def test_a_move_is_the_later_probes_time_over_the_calibrations():
    assert moved({"compute": 0.02, "memory": 0.04}, {"compute": 0.023, "memory": 0.038}) == {
        "compute": pytest.approx(0.15), "memory": pytest.approx(-0.05)}
    assert past_limits({"compute": 0.04, "memory": -0.09}) == []
    assert [w.split(" probe")[0] for w in past_limits({"compute": -0.06, "memory": 0.2})] == [
        "the host's compute", "the host's memory"]


def test_a_host_that_moved_is_recorded_and_warned_of_not_judged():
    still = note_host(_record(warnings=[]), {"compute": 0.0, "memory": 0.0}, {"compute": 0.02, "memory": 0.03})
    assert still["faithful"] and still["within_targets"] and still["warnings"] == []
    assert still["host_moved"]["after"]["compute"] == 0.02
    for before, after in (({"compute": 0.12}, {"compute": 0.0}), ({"compute": 0.0}, {"memory": -0.15})):
        r = note_host(_record(warnings=["w"], testbed_why=["steal 9%"]), before, after)
        assert r["faithful"] and r["within_targets"] and r["testbed_why"] == ["steal 9%"]
        assert r["warnings"][0] == "w" and "probe took" in r["warnings"][1]
