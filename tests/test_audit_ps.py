"""emu audit on ps runs (issue 10): a run whose parameter server died and resumed from its
checkpoint audits clean; an update counted twice or a version never made is found; a mode the audit
has no checks for is refused in one line, not audited as FL (which found false losses in ps runs)."""

from __future__ import annotations

import json

import pytest
from helpers import copy_run
from test_ps import run, scenario, with_offline

from dtemu.report import audit as audit_cli
from dtemu.report.audit import NotAudited, audit


@pytest.fixture(scope="module")
def restarted(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-ps")
    s = with_offline(scenario(algorithm="esync", rounds=6, round_timeout_s=1.0, query_timeout_s=0.05), "ps", 0.07, 0.2)
    summary, _ = run(root, s)
    return summary, root / "run"


def test_a_run_whose_server_resumed_audits_clean(restarted):
    summary, folder = restarted
    result = audit(folder)
    assert result["mode"] == "ps" and result["lost_data"] == 0, result["problems"]
    assert result["server_lives"] == 2 and result["rounds"] == summary["rounds"] == 6
    assert result["updates"] == summary["updates"] and result["faults"].get("node_down") == 1
    assert audit_cli.main([str(folder)]) == 0


def test_an_update_counted_twice_is_found(restarted, tmp_path):
    _, folder = restarted
    def twice(lines):
        i = max(k for k, line in enumerate(lines) if '"kind":"ps_update"' in line.replace(" ", ""))
        return lines[:i + 1] + [lines[i]] + lines[i + 1:]
    result = audit(copy_run(folder, tmp_path / "twice", twice))
    assert result["lost_data"] >= 1 and any("summary counts" in p for p in result["problems"])


def test_a_version_never_made_is_found(restarted, tmp_path):
    _, folder = restarted
    def gap(lines):
        rounds = [k for k, line in enumerate(lines) if '"kind":"ps_round"' in line.replace(" ", "")]
        return [line for k, line in enumerate(lines) if k != rounds[-2]]
    result = audit(copy_run(folder, tmp_path / "gap", gap))
    assert any("made versions" in p for p in result["problems"]), result["problems"]


def test_a_mode_without_checks_is_refused_not_misread(tmp_path, capsys):
    (tmp_path / "summary.json").write_text(json.dumps({"mode": "newmode", "runtime": "emu"}))
    (tmp_path / "events.jsonl").write_text(json.dumps({"t": 0, "node": "worker0", "kind": "node_up"}) + "\n")
    with pytest.raises(NotAudited):
        audit(tmp_path)
    assert audit_cli.main([str(tmp_path)]) == 2
    assert "is a newmode run: emu audit checks fl, ddp, ps, geo, flower runs" in capsys.readouterr().err
