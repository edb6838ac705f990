"""Mode ps for real (issue 10): ``real launch`` of a parameter server, the state server and
workers over CycloneDDS on loopback, against emu.

A deterministic schedule (``ps.fixed_iterations``: no state server decides anything) ends
with the same model in both runtimes; with ESync's adaptive rule, the iteration counts
in real follow the speeds measured on the wall clock (a staged 10x straggler).
Bounded waits, the loopback profile, a DDS domain per run (tests/helpers.py).
"""

import pytest

pytest.importorskip("cyclonedds")

from dtemu.core.scenario import parse_scenario  # noqa: E402
from dtemu.emu.run import run_emulation  # noqa: E402
from dtemu.host.rundir import read_events, read_summary  # noqa: E402
from helpers import DATA, needs_mnist, scenario_file  # noqa: E402
from test_real_mode import launch, logs  # noqa: E402

pytestmark = needs_mnist

PS = {
    "name": "real_ps",
    "mode": "ps",
    "seed": 5,
    "model": "small_cnn",
    "threads": 1,
    "data": {"partition": "iid", "test_samples": 500},
    "ps": {"workers": 2, "algorithm": "esync", "fixed_iterations": 3, "rounds": 3, "batch_size": 32,
           "lr": 0.05, "round_timeout_s": 40, "barrier_timeout_s": 30},
    "compute": {"nodes": {"worker2": {"slowdown": 3}}},
}


@pytest.fixture(autouse=True)
def data_root(monkeypatch):
    monkeypatch.setenv("DTEMU_DATA", DATA)


def test_fixed_iterations_give_the_same_model_in_emu_and_real(tmp_path):
    out = tmp_path / "real"
    done = launch(scenario_file(tmp_path, PS), out, 90.0)
    assert done.returncode == 0, done.stderr + logs(out)
    real = read_summary(out)
    emu = run_emulation(parse_scenario(PS), tmp_path / "emu")
    assert real["rounds"] == emu["rounds"] == 3 and real["stop_reason"] == "done"
    assert real["local_iterations"] == emu["local_iterations"] == {"worker1": 9, "worker2": 9}
    assert real["model_sha256"] == emu["model_sha256"]
    assert real["final_accuracy"] == emu["final_accuracy"]
    assert set(real["blocking_time_s"]) == {"worker1", "worker2"}
    assert real["real"]["exit_codes"] == {str(r): 0 for r in range(4)}


@pytest.mark.slow
def test_adaptive_iterations_follow_the_measured_speeds(tmp_path):
    raw = {**PS, "name": "real_ps_adaptive",
           "ps": {**PS["ps"], "fixed_iterations": None, "rounds": 4},
           "compute": {"nodes": {"worker2": {"slowdown": 10}}}}
    out = tmp_path / "real"
    done = launch(scenario_file(tmp_path, raw), out, 120.0)
    assert done.returncode == 0, done.stderr + logs(out)
    summary = read_summary(out)
    assert summary["iterations_per_round"]["worker2"] == 1.0
    # the fast worker fills the straggler's (staged, wall-clock) time with local iterations
    rounds = [e for e in read_events(out) if e["kind"] == "ps_round"][1:]
    assert rounds and all(e["iterations"]["worker1"] >= 3 for e in rounds), rounds
    assert summary["state_server"]["queries"] > 0
