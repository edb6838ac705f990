"""emu audit on finished, killed and missing run folders."""

import json

from dtemu.emu.cli import main as emu_main
from dtemu.report.audit import audit
from test_fl_faults import run, scenario


def test_audit_of_a_run_that_was_killed_checks_what_it_got_to(tmp_path, capsys):
    run(tmp_path, scenario(), name="run")
    folder = tmp_path / "run"
    assert audit(folder)["finished"] is True and audit(folder)["lost_data"] == 0
    (folder / "summary.json").unlink()  # killed: no summary, and its last line torn
    lines = (folder / "events.jsonl").read_text().splitlines()
    (folder / "events.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n" + lines[len(lines) // 2][:10])
    result = audit(folder)
    assert result["finished"] is False and result["lost_data"] == 0 and result["torn_event_lines"] == 1
    assert emu_main(["audit", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finished"] is False


def test_audit_of_a_folder_that_is_no_run_says_so(tmp_path, capsys):
    assert emu_main(["audit", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
