"""Hostile scenario files: each refused, exit 2, a message naming the key or the limit, and
nothing left behind (no run folder).  How fast: ``python -m tools.bench_hostile`` (docs/notebook/)."""

from pathlib import Path

import pytest

from dtemu.emu.cli import main as emu_main

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))

CASES = {
    "deep": ("[" * 10_000 + "]" * 10_000, "nested deeper than 32 levels"),
    "alias_bomb": (BOMB, "expands to more than 100,000 values"),
    "huge_file": ("name: big\n" + "# padding\n" * 6_000_000, "a scenario may have at most 1,048,576"),
    "unknown_keys": ("name: x\n" + "".join(f"k{i}: 1\n" for i in range(20)), "k0"),
    "huge_rounds": ("name: x\nfl: {rounds: 1000000000000}\n", "fl.rounds: expected 1..4,294,967,295"),
    "huge_int": ("name: x\nseed: 100000000000000000000000\n", "seed: expected an integer of at most 64 bits"),
    "negative_seed": ("name: x\nseed: -1\n", "seed: expected 0.."),
    "huge_epochs": ("name: x\nfl: {epochs: 70000}\n", "fl.epochs: expected 1..65,535"),
    "long_name": ("name: " + "n" * 300 + "\n", "name: expected 1 to 100 letters"),
    "path_name": ("name: ../../etc/x\n", "name: expected 1 to 100 letters"),
    "not_a_model": ("name: x\nmodel: 'os:getcwd'\n", "model: model factory 'os:getcwd' returned str"),
    "failing_factory": ("name: x\nmodel: 'os:system'\n", "model: model factory 'os:system' failed"),
    "missing_factory": ("name: x\nmodel: 'no_such_module_x:f'\n", "model: model factory"),
    # the user's code exiting or interrupting is the scenario's error too, never a silent exit 0
    "exiting_factory": ("name: x\nmodel: 'sys:exit'\n", "model: model factory 'sys:exit' failed: SystemExit"),
    "interrupting_factory": ("name: x\nmodel: 'test_hostile_scenarios:interrupt'\n",
                             "failed: KeyboardInterrupt: pressed by a factory"),
    "exiting_data_factory": ("name: x\ndata: {factory: 'sys:exit'}\n",
                             "data.factory: data factory 'sys:exit' failed: SystemExit"),
    "no_data_set": ("name: x\ndata: {factory: 'os:getcwd'}\n", "data.factory: data factory 'os:getcwd' returned str"),
    "not_utf8": (b"name: \xff\xfe\n", "is not UTF-8 text"),
    "not_yaml": ("name: [unclosed\n", "is not valid YAML"),
    "not_a_checkpoint": ("name: x\nfl: {init_path: SCENARIO}\n", "fl.init_path:"),
}


def interrupt():
    raise KeyboardInterrupt("pressed by a factory")


def write_case(case: str, folder: Path) -> Path:
    text, _ = CASES[case]
    path = folder / f"{case}.yaml"
    if isinstance(text, str):
        text = text.replace("SCENARIO", str(path)).encode()
    path.write_bytes(text)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_scenario_is_refused_with_nothing_left_behind(case, tmp_path, capsys):
    _, message = CASES[case]
    path = write_case(case, tmp_path)
    out = tmp_path / "run"
    code = emu_main(["run", str(path), "--no-tui", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err, err
    assert not out.exists()


def test_resuming_a_checkpoint_already_at_the_last_round_says_what_to_do(tmp_path, capsys):
    import numpy as np

    from dtemu.core.wire.checkpoint import Checkpoint, encode_checkpoint

    ckpt = tmp_path / "c.dtck"
    ckpt.write_bytes(encode_checkpoint(Checkpoint(3, np.zeros(4, np.float32), "digest", {})))
    path = tmp_path / "s.yaml"
    path.write_text(f"name: x\nfl: {{rounds: 3, init_path: {ckpt}}}\n")
    assert emu_main(["run", str(path), "--no-tui", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "checkpoint of round 3, and fl.rounds is 3" in err and "--set fl.rounds=13" in err


@pytest.mark.parametrize("spec", ["model: 'code_that_ran:factory'", "data: {factory: 'code_that_ran:factory'}"])
def test_no_code_refuses_a_scenario_that_names_code_before_importing_it(spec, tmp_path, capsys, monkeypatch):
    (tmp_path / "code_that_ran.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\ndef factory(): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "s.yaml"
    path.write_text(f"name: x\n{spec}\n")
    code = emu_main(["run", str(path), "--no-tui", "--no-code", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "names code" in err and "--no-code" in err, err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "run").exists()


def test_no_code_lets_a_registered_model_through():
    from dtemu.host.scenario_file import load_scenario

    shipped = Path(__file__).resolve().parents[1] / "scenarios" / "fl_codecs.yaml"
    assert load_scenario(shipped, allow_code=False).model == "mnist_cnn"


def test_real_refuses_code_too(tmp_path, capsys):
    from dtemu.real.cli import main as real_main

    path = tmp_path / "s.yaml"
    path.write_text("name: x\nmodel: 'os:getcwd'\n")
    assert real_main(["launch", str(path), "--no-tui", "--no-code", "--out", str(tmp_path / "run")]) == 2
    assert "names code" in capsys.readouterr().err
