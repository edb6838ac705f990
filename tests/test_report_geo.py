"""The geo report (issue 11) on real emu runs of the geo roles over a tiny stand-in model: its
numbers are the run's own (summary and events agree), it draws its figures, and a run cut short
is reported as far as it got."""

from __future__ import annotations

import pytest
from helpers import copy_run
from test_geo import StandIn, geo_scenario

from dtemu.emu.run import run_emulation
from dtemu.report import report
from dtemu.report.geo import geo_accuracy_curve, geo_nodes, geo_table, geo_time_to_accuracy, geo_wan_curve
from dtemu.report.runs import load_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("geo-report")
    out = {}
    for name, sets in (("hips", {}), ("bisparse", {"geo.compression": "bisparse_fp16"}),
                       ("flat", {"geo.architecture": "flat"})):
        out[name] = (run_emulation(geo_scenario(**sets), root / name, work=StandIn()), root / name)
    return out


def test_the_table_is_the_runs_own_numbers(runs):
    loaded = [load_run(folder) for _, folder in runs.values()]
    rows = geo_table(loaded)
    assert [r["label"] for r in rows] == ["hips none", "hips bisparse_fp16", "flat none"]
    for row, (summary, _) in zip(rows, runs.values()):
        assert row["wan_up"] == summary["wan"]["up_per_node_round"]
        assert row["wan_down"] == summary["wan"]["down_per_node_round"]
        assert row["up_ratio"] == summary["wan"]["up_ratio"]
        assert row["final_accuracy"] == summary["final_accuracy"]
        assert row["time_to_accuracy"] == summary["time_to_accuracy"]
        assert row["s_per_round"] == pytest.approx(summary["time_s"] / 12)
        assert row["wan_bytes"] == summary["wan_bytes"] and row["models_agree"] is True
    assert rows[1]["wan_up"] < 0.1 * rows[0]["wan_up"]


@pytest.mark.parametrize("name, nodes", [("hips", ["a-ps", "b-ps"]), ("bisparse", ["a-ps", "b-ps"]),
                                         ("flat", ["a-w0", "a-w1", "b-w0", "b-w1"])])
def test_per_round_and_per_node_bytes_add_up_to_the_summary(runs, name, nodes):
    summary, folder = runs[name]
    run = load_run(folder)
    curve = geo_wan_curve(run)
    assert [r for r, _, _ in curve] == list(range(1, 13))
    # The events' per-round bytes, averaged, are the summary's per node and round.
    assert sum(u for _, u, _ in curve) / 12 == pytest.approx(summary["wan"]["up_per_node_round"], abs=1e-3)
    assert sum(d for _, _, d in curve) / 12 == pytest.approx(summary["wan"]["down_per_node_round"], abs=1e-3)
    per_node = geo_nodes(run)
    assert [row["node"] for row in per_node] == nodes
    assert all(row["rounds"] == 12 for row in per_node)
    assert sum(row["up"] for row in per_node) / len(nodes) == pytest.approx(summary["wan"]["up_per_node_round"],
                                                                           abs=1e-3)


def test_emu_report_writes_the_geo_page(runs, tmp_path, capsys):
    folders = [str(folder) for _, folder in runs.values()]
    assert report.main([*folders, "--out", str(tmp_path / "rep")]) == 0
    for name in ("geo.md", "geo_accuracy.png", "geo_wan.png", "geo_time_to_accuracy.png"):
        assert (tmp_path / "rep" / name).stat().st_size > 0
    text = (tmp_path / "rep" / "geo.md").read_text()
    assert "| hips bisparse_fp16 | emu | 10 | 12 |" in text and "| flat none | a-w0 | 12 |" in text
    assert "wrote" in capsys.readouterr().out


def test_a_run_cut_short_is_reported_from_its_events(runs, tmp_path):
    summary, folder = runs["hips"]
    run = load_run(copy_run(folder, tmp_path / "cut", lambda lines: lines[: len(lines) * 2 // 3], None))
    assert not run.finished
    curve = geo_accuracy_curve(run)
    assert curve and curve == geo_accuracy_curve(load_run(folder))[:len(curve)]
    tta = geo_time_to_accuracy(run)
    assert set(tta) == {"0.5"}
    hit = [t for t, _, a in curve if a >= 0.5]
    assert tta["0.5"] == (hit[0] if hit else None)
    row = geo_table([run])[0]
    assert row["label"].endswith("(unfinished)") and row["wan_up"] == pytest.approx(summary["wan"]["up_per_node_round"])
