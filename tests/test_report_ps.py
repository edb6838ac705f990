"""The ps report (issue 10) on real emu runs of ESync and SSGD over the synthetic data of
tests/test_ps.py: its numbers are the run's own (summary and events agree, the workers' per-round
blocking adds up to the summary's), it draws its figures, and a run cut short is reported from its
events as far as it got."""

from __future__ import annotations

import pytest
from helpers import copy_run
from test_ps import DATA, scenario

from dtemu.core.ml.workload import Workload
from dtemu.emu.run import run_emulation
from dtemu.report import report
from dtemu.report.ps import ps_curve, ps_labels, ps_table, ps_time_to_accuracy, ps_worker_rounds, ps_workers
from dtemu.report.runs import load_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ps-report")
    out = {}
    for name, algorithm in (("esync", "esync"), ("ssgd", "ssgd")):
        s = scenario(algorithm=algorithm, rounds=4)
        out[name] = (run_emulation(s, root / name, work=Workload(s, DATA)), root / name)
    return out


def test_the_table_is_the_runs_own_numbers(runs):
    loaded = [load_run(folder) for _, folder in runs.values()]
    rows = ps_table(loaded)
    assert [r["label"] for r in rows] == ["esync", "ssgd"]
    for row, (summary, _) in zip(rows, runs.values()):
        assert row["final_accuracy"] == summary["final_accuracy"] and row["final_loss"] == summary["final_loss"]
        assert row["time_to_accuracy"] == summary["time_to_accuracy"] and row["versions"] == summary["rounds"]
        assert row["samples_per_s"] == summary["samples_per_s"]
        assert row["blocking_mean"] == pytest.approx(sum(summary["blocking_time_s"].values()) / 4)
        assert row["iterations_max"] == max(summary["iterations_per_round"].values())
    assert rows[0]["iterations_max"] > 1 and rows[1]["iterations_min"] == rows[1]["iterations_max"] == 1.0


@pytest.mark.parametrize("name", ["esync", "ssgd"])
def test_per_round_blocking_and_iterations_add_up_to_the_summary(runs, name):
    summary, folder = runs[name]
    run = load_run(folder)
    rounds = ps_worker_rounds(run)
    assert sorted(rounds) == ["worker1", "worker2", "worker3", "worker4"]
    for worker, evs in rounds.items():
        assert sum(ev["blocked_s"] for ev in evs) == pytest.approx(summary["blocking_time_s"][worker], abs=1e-6)
        assert sum(ev["iterations"] for ev in evs) == summary["local_iterations"][worker]
    rows = {w["node"]: w for w in ps_workers(run)}
    assert rows["worker1"]["blocking_s"] == summary["blocking_time_s"]["worker1"]
    assert rows["worker1"]["sent"] == summary["bytes_per_node"]["worker1"]["sent"]
    if name == "ssgd":   # the fast workers wait for the stragglers every round
        assert rows["worker1"]["blocking_s"] > 10 * rows["worker4"]["blocking_s"]


def test_emu_report_writes_the_ps_page(runs, tmp_path, capsys):
    folders = [str(folder) for _, folder in runs.values()]
    assert report.main([*folders, "--out", str(tmp_path / "rep")]) == 0
    for name in ("ps.md", "ps_accuracy.png", "ps_time_to_accuracy.png", "ps_workers.png", "ps_rounds.png"):
        assert (tmp_path / "rep" / name).stat().st_size > 0
    text = (tmp_path / "rep" / "ps.md").read_text()
    assert "| esync | emu | 4 |" in text and "| ssgd | worker4 | 4 | 4 (1.0) |" in text
    assert "wrote" in capsys.readouterr().out


def test_labels_say_what_tells_the_runs_apart(runs, tmp_path):
    s = scenario(algorithm="fedasync", staleness="hinge", rounds=3, slow=30.0)
    run_emulation(s, tmp_path / "fa", work=Workload(s, DATA))
    loaded = [load_run(runs["esync"][1]), load_run(tmp_path / "fa")]
    assert ps_labels(loaded) == ["esync h_c=10", "fedasync hinge h_c=30"]


def test_a_run_cut_short_is_reported_from_its_events(runs, tmp_path):
    summary, folder = runs["esync"]
    run = load_run(copy_run(folder, tmp_path / "cut", lambda lines: lines[: len(lines) * 2 // 3], None))
    assert not run.finished
    curve = ps_curve(run)
    assert curve and curve == ps_curve(load_run(folder))[:len(curve)]
    tta = ps_time_to_accuracy(run)
    assert set(tta) == {"0.5", "0.9"}
    hit = [t for t, _, a, _ in curve if a >= 0.5]
    assert tta["0.5"] == (hit[0] if hit else None)
    row = ps_table([run])[0]
    assert row["label"] == "esync (unfinished)" and row["final_accuracy"] == curve[-1][2]
    workers = {w["node"]: w for w in ps_workers(run)}
    assert workers["worker1"]["blocking_s"] == pytest.approx(
        sum(ev["blocked_s"] for ev in ps_worker_rounds(run)["worker1"]))
