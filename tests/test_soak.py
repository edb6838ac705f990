"""The soak's random-fault scenario and the audit that checks a run lost nothing."""

import json

import pytest

from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation
from helpers import needs_mnist
from dtemu.report.audit import audit
from dtemu.report.soak import soak_scenario


@pytest.mark.parametrize("mode", ["emu", "real"])
def test_soak_scenarios_are_valid_and_reproducible(mode):
    raw = soak_scenario(mode, 200, seed=4)
    parse_scenario(raw)
    assert raw == soak_scenario(mode, 200, seed=4)
    kinds = {c["node"] == "controller" for c in raw["faults"]["crashes"]}
    assert kinds == {True, False} and raw["faults"]["partitions"] and raw["faults"]["corrupt"]


@needs_mnist
def test_short_emu_soak_loses_nothing_and_the_audit_notices_tampering(tmp_path, monkeypatch):
    from helpers import DATA
    monkeypatch.setenv("DTEMU_DATA", DATA)
    raw = soak_scenario("emu", 40, seed=2)
    raw["data"]["test_samples"] = 200
    run_emulation(parse_scenario(raw), tmp_path / "run")
    result = audit(tmp_path / "run")
    assert result["lost_data"] == 0, result["problems"]
    assert result["rounds"] >= 30 and len(result["faults"]) >= 5
    assert result["updates"]["accepted"] > 60

    # A round checkpointed twice, and a tally the events do not back, are both caught.
    events = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    ckpt = next(line for line in events if '"kind":"checkpoint"' in line)
    (tmp_path / "run" / "events.jsonl").write_text("\n".join(events + [ckpt]) + "\n")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    summary["updates"]["accepted"] += 1
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    assert audit(tmp_path / "run")["lost_data"] == 2
