"""tools/fidelity.py's reading of an ESync run: a version's time on the parameter server's clock,
less the slowest worker's compute on it (each worker's total on its own clock, differenced)."""

import pytest

from tools.fidelity import ROWS, compare_esync, esync_compute, esync_versions


def _run(version_s: float, computes: dict[str, list[float]]) -> list[dict]:
    events = [{"kind": "ps_round", "node": "ps", "version": v, "t": 10.0 + v * version_s} for v in range(4)]
    for worker, per in computes.items():
        total = 0.0
        for v, c in enumerate(per):
            total += c
            events.append({"kind": "ps_worker_round", "node": worker, "round": v, "compute_s": total})
    return events


def test_versions_and_their_slowest_compute():
    events = _run(2.0, {"worker1": [0.5, 0.6, 0.7, 0.8], "worker2": [1.0, 0.2, 0.2, 0.2]})
    assert esync_versions(events) == {1: 2.0, 2: 2.0, 3: 2.0}
    assert esync_compute(events) == pytest.approx({0: 1.0, 1: 0.6, 2: 0.7, 3: 0.8})


def test_errors_are_emu_against_real():
    real = _run(2.0, {"worker1": [1.0] * 4})
    emu = _run(2.2, {"worker1": [1.0] * 4})
    cmp = compare_esync(real, emu)
    assert [r["round"] for r in cmp["rounds"]] == [1, 2, 3]
    assert cmp["mean"]["error_pct"] == pytest.approx(10.0)
    assert cmp["mean"]["real_comm_s"] == pytest.approx(1.0) and cmp["mean"]["comm_error_pct"] == pytest.approx(20.0)


def test_the_six_rows_of_the_issue():
    assert [(r.mode, r.scenario.split("/")[-1]) for r in ROWS.values()] == [
        ("fl", "fl_codecs.yaml"), ("ddp", "ddp_baseline.yaml"), ("ddp", "ddp_dgc.yaml"), ("ps", "esync.yaml"),
        ("geo", "geo_hips.yaml"), ("geo", "geo_bisparse_fp16.yaml")]
