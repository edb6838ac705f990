"""emu audit on ddp runs: a worker lost mid-run with the survivors going on (one a step apart,
which skips ahead or redoes a step at the regrouping) and a run that stops at the loss audit clean;
a step missing from the events, or a summary whose model or lost ranks are not the events', is
found."""

from __future__ import annotations

import pytest
from helpers import copy_run, needs_mnist
from test_ddp_faults import run, scenario

from dtemu.report.audit import audit

pytestmark = needs_mnist


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-ddp")
    out = {}
    for name, raw in (("apart", scenario("apart", on="continue", min_workers=2, slow_down="worker1")),
                      ("ahead", scenario("ahead", on="continue", min_workers=2, slow_down="worker0")),
                      ("stop", scenario("stop"))):
        summary, _ = run(root, raw)
        out[name] = (summary, root / raw["name"])
    return out


@pytest.mark.parametrize("name", ["apart", "ahead", "stop"])
def test_lost_workers_audit_clean(runs, name):
    summary, folder = runs[name]
    result = audit(folder)
    assert result["mode"] == "ddp" and result["lost_data"] == 0, result["problems"]
    assert result["lost_ranks"] == summary["lost_ranks"] == [2] and result["steps"] == summary["steps"]


def test_a_missing_step_is_found(runs, tmp_path):
    _, folder = runs["apart"]
    def drop(lines):
        steps = [k for k, line in enumerate(lines) if '"kind":"step"' in line and '"node":"worker0"' in line]
        return [line for k, line in enumerate(lines) if k != steps[3]]
    result = audit(copy_run(folder, tmp_path / "drop", drop))
    assert any("worker0 (life 1) stepped" in p for p in result["problems"]), result["problems"]
    assert any("worker0 counts" in p for p in result["problems"])


def test_a_summary_that_disagrees_with_the_events_is_found(runs, tmp_path):
    _, folder = runs["apart"]
    result = audit(copy_run(folder, tmp_path / "s", edit_summary=lambda s: {**s, "lost_ranks": [], "model_sha256": "0" * 64}))
    assert result["lost_data"] == 2, result["problems"]
