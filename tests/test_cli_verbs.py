"""The user tools as CLI verbs: each has --help, documents every flag, and runs as written."""

from __future__ import annotations

import json

import pytest

from dtemu.emu.cli import _parser as emu_parser
from dtemu.emu.cli import main as emu_main
from dtemu.emu.sweep import folder_name, grid
from dtemu.real.cli import _parser as real_parser
from helpers import needs_mnist

TINY = "name: tiny\nmodel: small_cnn\ndata: {test_samples: 200}\ntargets: [0.3]\n" \
       "fl: {clients: 2, rounds: 2, subset: 64, batch_size: 32}\n"


def subcommands(parser) -> dict:
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


@pytest.mark.parametrize("cli,verbs", [(emu_parser, {"run", "report", "audit", "soak", "sweep", "calibrate"}),
                                       (real_parser, {"run", "launch", "report", "audit", "soak", "rogue"})])
def test_every_verb_has_help_for_every_flag(cli, verbs):
    got = subcommands(cli())
    assert verbs <= set(got), verbs - set(got)
    for name, sub in got.items():
        assert sub.description or sub.format_usage(), name
        for action in sub._actions:
            if action.option_strings and action.help != "==SUPPRESS==":
                assert action.help, f"{name} {action.option_strings} has no help"


def test_the_grid_is_every_combination_in_order():
    assert grid(["fl.codec=fp32,q8", "fl.lr=[0.05, 0.1]"]) == [
        ["fl.codec=fp32", "fl.lr=0.05"], ["fl.codec=fp32", "fl.lr=0.1"],
        ["fl.codec=q8", "fl.lr=0.05"], ["fl.codec=q8", "fl.lr=0.1"]]
    assert grid(["faults.offline=[[], [{node: client1, start_s: 3}]]"]) == [
        ["faults.offline=[]"], ['faults.offline=[{"node": "client1", "start_s": 3}]']]
    assert grid([]) == [[]]
    assert "/" not in folder_name(["data.root=/tmp/x"])


def test_a_bad_value_anywhere_in_the_grid_is_refused_before_any_run(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    assert emu_main(["sweep", str(path), "--vary", "fl.codec=fp32,int8", "--out", str(tmp_path / "sw")]) == 2
    assert "fl.codec" in capsys.readouterr().err and not (tmp_path / "sw").exists()


@needs_mnist
def test_a_sweep_tabulates_each_run_and_goes_on_where_it_stopped(tmp_path, capsys, monkeypatch):
    from helpers import DATA

    monkeypatch.setenv("DTEMU_DATA", DATA)
    path = tmp_path / "s.yaml"
    path.write_text(TINY)
    argv = ["sweep", str(path), "--vary", "fl.codec=fp32,q8", "--out", str(tmp_path / "sw")]
    assert emu_main(argv) == 0
    table = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["set"] for r in table["runs"]] == [["fl.codec=fp32"], ["fl.codec=q8"]]
    fp32, q8 = table["runs"]
    assert q8["bytes_up"] < fp32["bytes_up"] / 3 and fp32["rounds"] == 2
    assert "fl.codec=q8" in (tmp_path / "sw" / "sweep.md").read_text()
    capsys.readouterr()
    assert emu_main(argv) == 0  # both finished: read back, not run again
    assert "[1/2]" not in capsys.readouterr().out
    assert json.loads((tmp_path / "sw" / "sweep.json").read_text())["runs"] == table["runs"]


def test_the_real_cli_loads_no_transport_until_a_rank_runs():
    """Loading CycloneDDS when `real` starts (with the rogue verb) made a restarted controller
    miss its clients' resent updates (tests/test_real_faults.py, launch with crashes): the
    verbs load what they need when they run."""
    import subprocess
    import sys

    code = "import sys, dtemu.real.cli, dtemu.emu.cli; print('cyclonedds' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def readme_commands() -> list[str]:
    """Every `emu ...` / `real ...` command the README shows, in code blocks or inline."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    verbs = r"(?:emu|real) (?:run|launch|report|audit|soak|sweep|calibrate|rogue|validate)\b"
    found = re.findall(rf"^{verbs}[^\n#]*", text, flags=re.M)
    found += [m.replace("\n", " ") for m in re.findall(rf"`({verbs}[^`]*)`", text)]
    # a bare verb inline (`real launch` restarts it) names the verb, it is no command
    return sorted({c.strip() for c in found if len(c.split()) > 2 or c.strip() in ("emu soak", "real soak")})


def test_every_command_the_readme_shows_parses_as_written():
    import shlex

    commands = readme_commands()
    assert len(commands) >= 15, commands
    placeholders = {"SCENARIO": "scenarios/fl_codecs.yaml", "RUN": "runs/A", "N": "7", "ADDR,ADDR": "10.0.0.1,10.0.0.2",
                    "RATE": "100", "FILE": "profile.yaml", "...": "scenarios/fl_codecs.yaml"}
    for command in commands:
        words = [placeholders.get(w, w) for w in shlex.split(command.replace("[", "").replace("]", "").replace("|", " "))]
        cli = emu_parser if words[0] == "emu" else real_parser
        try:
            args = cli().parse_args(words[1:])
        except SystemExit as err:
            raise AssertionError(f"the README's `{command}` does not parse: exit {err.code}") from None
        scenario = getattr(args, "scenario", None)
        if scenario and scenario.startswith("scenarios/"):
            from pathlib import Path

            assert (Path(__file__).resolve().parents[1] / scenario).exists(), command
