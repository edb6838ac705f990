"""emu audit on geo runs (issue 11): runs of every sync mode, with a lost site and with a site that
joins late, audit clean; a round the root PS never closed, or a summary whose lost nodes or model
are not the events', is found."""

from __future__ import annotations

import json

import pytest
from helpers import copy_run
from test_geo import StandIn, geo_scenario

from dtemu.emu.run import run_emulation
from dtemu.report import audit as audit_cli
from dtemu.report.audit import audit

CASES = {
    "fsa": {}, "flat": {"geo.architecture": "flat"}, "bisparse": {"geo.compression": "bisparse_fp16"},
    "hfa": {"geo.sync": "hfa", "geo.k1": 2, "geo.k2": 2}, "mixed": {"geo.sync": "mixed"},
    "lost_site": {"faults.offline": '[{"node": "b-ps", "start_s": 0.05}]'},
    "late_site": {"geo.joining": "true", "geo.start_wait_s": 0.2, "faults.offline": json.dumps(
        [{"node": n, "start_s": 0, "end_s": 0.5} for n in ("b-ps", "b-w0", "b-w1")])},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-geo")
    return {name: (run_emulation(geo_scenario(**sets), root / name, work=StandIn()), root / name)
            for name, sets in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_every_mode_audits_clean(runs, name):
    summary, folder = runs[name]
    result = audit(folder)
    assert result["mode"] == "geo" and result["lost_data"] == 0, result["problems"]
    assert result["rounds"] == summary["rounds"] and result["lost"] == summary["lost"]
    if name == "lost_site":
        assert result["lost"] == ["b-ps"] and result["faults"].get("node_down") == 1
    if name == "late_site":   # given up at the start, let in later: not lost
        assert result["lost"] == [] and result["joined"] == ["b"]
    assert audit_cli.main([str(folder)]) == 0


def test_a_round_the_root_never_closed_is_found(runs, tmp_path):
    _, folder = runs["fsa"]
    def gap(lines):
        closes = [k for k, line in enumerate(lines) if '"geo_round"' in line and '"global-ps"' in line]
        return [line for k, line in enumerate(lines) if k != closes[4]]
    result = audit(copy_run(folder, tmp_path / "gap", gap))
    assert any("global-ps (life 1) closed rounds" in p for p in result["problems"]), result["problems"]


def test_a_summary_that_disagrees_with_the_events_is_found(runs, tmp_path):
    _, folder = runs["lost_site"]
    result = audit(copy_run(folder, tmp_path / "s", edit_summary=lambda s: {**s, "lost": [], "model_sha256": "0" * 64}))
    assert len(result["problems"]) == 2 and result["lost_data"] == 2
    assert audit_cli.main([str(tmp_path / "s")]) == 1
