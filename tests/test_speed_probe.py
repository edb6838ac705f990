"""emu.speed_probe and emu.fidelity.judge_host: a run on a host whose speed moved away from the
calibration's is not a faithful testbed (emu validate probes after calibrating and after each run)."""

import pytest

from dtemu.emu.fidelity import judge_host
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


def test_a_host_that_moved_before_or_after_the_run_makes_it_unfaithful_and_not_counted():
    still = judge_host(_record(), {"compute": 0.0, "memory": 0.0}, {"compute": 0.02, "memory": 0.03})
    assert still["faithful"] and still["within_targets"] and still["host_moved"]["after"]["compute"] == 0.02
    for before, after in (({"compute": 0.12}, {"compute": 0.0}), ({"compute": 0.0}, {"memory": -0.15})):
        r = judge_host(_record(testbed_why=["steal 9%"]), before, after)
        assert not r["faithful"] and not r["within_targets"] and r["errors_within_targets"]
        assert r["testbed_why"][0] == "steal 9%" and "probe took" in r["testbed_why"][1]
