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
    # one report reads both folders alike; real's per-round blocking adds up to its summary's
    from dtemu.report.ps import ps_table, ps_worker_rounds
    from dtemu.report.runs import load_run

    rows = ps_table([load_run(out), load_run(tmp_path / "emu")])
    assert [r["label"] for r in rows] == ["esync (real)", "esync (emu)"]
    assert rows[0]["versions"] == rows[1]["versions"] == 3 and rows[0]["final_accuracy"] == rows[1]["final_accuracy"]
    for worker, evs in ps_worker_rounds(load_run(out)).items():
        assert sum(e["blocked_s"] for e in evs) == pytest.approx(real["blocking_time_s"][worker], abs=1e-6)


@pytest.mark.slow
def test_a_sealed_esync_run_ends_with_emus_model(tmp_path):
    """--key-file: every message in the run's envelope (and every frame tagged by the transport)."""
    from test_real_mode import new_domain, real

    (tmp_path / "key").write_text("an esync key of sixteen bytes or more")
    out = tmp_path / "real"
    done = real(["launch", scenario_file(tmp_path, PS), "--out", out, "--no-tui", "--timeout", 80, "--threads", 1,
                 "--time-scale", 1, "--domain", new_domain(), "--key-file", tmp_path / "key"], 90)
    assert done.returncode == 0, done.stderr + logs(out)
    real_summary = read_summary(out)
    emu = run_emulation(parse_scenario(PS), tmp_path / "emu", key=b"an esync key of sixteen bytes or more")
    assert real_summary["sealed"] and emu["sealed"]
    assert real_summary["model_sha256"] == emu["model_sha256"] and real_summary["rounds"] == 3
    assert [e["authenticated"] for e in read_events(out) if e["kind"] == "run_start"] == [True]


@pytest.mark.slow  # (the default run keeps under 10 minutes on 2 cores; issue 45)
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


@pytest.mark.parametrize("topic", ["ps/state_reply", "ps/model"])
def test_answers_to_one_worker_reach_that_worker_alone(topic):
    """The state server's answers and a parameter server's model to one worker travel on the
    addressee's own DDS topic once its writer matched (the first send sets it up): the other
    workers no longer take and drop them (12 workers each dropped 11 answers a round)."""
    import time

    from dtemu.real.transport import DdsTransport
    from helpers import new_domain

    domain, pid = new_domain(), __import__("os").getpid()
    names = [f"{n}-{pid}" for n in ("ss", "w1", "w2")]
    with DdsTransport(names[0], domain_id=domain) as ss, \
            DdsTransport(names[1], domain_id=domain, subscribe=[topic]) as w1, \
            DdsTransport(names[2], domain_id=domain, subscribe=[topic]) as w2:
        assert not ss.wait_matched({topic: 2}, timeout_s=20)
        ss.send(topic, b"first", to=names[1])  # sets up the writer to w1; may go on the shared topic
        phys = ss.addressed_topic(topic, names[1])
        deadline = time.monotonic() + 20
        while not ss.matched_count(phys) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ss.matched_count(phys) == 1
        assert w1.recv([topic], timeout_s=10).data == b"first"
        dropped = w2.stats["not_for_me"]
        for i in range(10):
            ss.send(topic, b"answer %d" % i, to=names[1])
        got = [w1.recv([topic], timeout_s=10) for _ in range(10)]
        assert [m.data for m in got] == [b"answer %d" % i for i in range(10)]
        assert all(m.topic == topic and m.src == names[0] for m in got)  # still said as its topic
        assert w2.recv([topic], timeout_s=0.3) is None
        assert w2.stats["not_for_me"] == dropped  # nothing of w1's reached w2


@pytest.mark.slow
def test_parameter_server_killed_and_restarted_resumes_from_its_checkpoint(tmp_path):
    """Real kill of the parameter server after round 2, restarted with ``real run --append``:
    it resumes from its checkpoint, publishes that model again, the workers resend the updates
    the dead server lost, and the run ends with the model of an uninterrupted emu run."""
    from helpers import Ranks

    raw = {**PS, "name": "real_ps_restart",
           "ps": {**PS["ps"], "rounds": 6, "round_timeout_s": 60, "barrier_timeout_s": 60},
           "compute": {"nodes": {"worker2": {"slowdown": 30}}}}  # rounds of ~0.3 s: room to kill in one
    ranks = Ranks(scenario_file(tmp_path, raw), tmp_path)
    try:
        for rank, name in enumerate(("ps", "ss", "worker1", "worker2")):
            ranks.start(rank, name)
        ranks.wait_event("ps", "ps_round", 120.0, version=2)
        ranks.kill("ps")
        ranks.wait("ps", 10.0)
        ranks.start(0, "ps", args=("--append",))
        for name in ("ps", "ss", "worker1", "worker2"):
            assert ranks.wait(name, 120.0) == 0, ranks.logs()
        real = read_summary(tmp_path / "ps")
    finally:
        ranks.close()
    events = ranks.events("ps")
    starts = [e for e in events if e["kind"] == "run_start"]
    assert len(starts) == 2 and starts[1]["first_round"] >= 2  # the second life began from its checkpoint
    assert real["rounds"] == 6 and real["stop_reason"] == "done"
    emu = run_emulation(parse_scenario(raw), tmp_path / "emu")
    assert real["model_sha256"] == emu["model_sha256"]
    assert real["final_accuracy"] == emu["final_accuracy"]


@pytest.mark.slow
def test_a_diverged_asynchronous_run_ends_with_its_reason(tmp_path):
    """ASGD whose updates turn non-finite (deep linear layers at lr 2, tests/ps_models.py): each
    worker reports NOT_FINITE, the server answers with its model and, once the model has diverged,
    stops everyone; before, the workers waited for a newer model and the server for updates until
    ``ps.max_time_s``.  The same reason as emu's, well before the 60 s budget."""
    raw = {**PS, "name": "real_ps_diverged", "model": "tests.ps_models:deep_linear",
           "ps": {**PS["ps"], "algorithm": "asgd", "fixed_iterations": None, "rounds": 400, "lr": 2.0,
                  "max_time_s": 60},
           "compute": {"default": {"train_s_per_sample": 1e-4}}}
    out = tmp_path / "real"
    done = launch(scenario_file(tmp_path, raw), out, 60.0)
    assert done.returncode == 0, done.stderr + logs(out)
    real = read_summary(out)
    assert real["stop_reason"].startswith("diverged: "), real["stop_reason"]
    assert real["rounds"] < 400 and real["wall_time_s"] < 40
    assert real["real"]["exit_codes"] == {str(r): 0 for r in range(4)}
    emu = run_emulation(parse_scenario(raw), tmp_path / "emu")
    assert emu["stop_reason"].startswith("diverged: ") and emu["time_s"] < 1.0


@pytest.mark.slow
def test_state_server_killed_for_real_and_restarted_the_run_goes_on(tmp_path):
    """Real kill of the state server after round 2: the workers' queries get no answer within
    ``ps.query_timeout_s`` and they synchronise (one local iteration a round while it is down);
    restarted with ``real run --append`` it starts an empty table, the parameter server's next
    RESET fills it, and the fast worker again fills the straggler's time.  The run ends, all 12
    rounds (a restarted rank takes a few seconds to start: rounds of ~1 s go on meanwhile)."""
    from helpers import Ranks

    raw = {**PS, "name": "real_ss_restart",
           "ps": {**PS["ps"], "fixed_iterations": None, "rounds": 12, "round_timeout_s": 60, "barrier_timeout_s": 60,
                  "query_timeout_s": 1.0},
           "compute": {"nodes": {"worker2": {"slowdown": 30}}}}
    ranks = Ranks(scenario_file(tmp_path, raw), tmp_path)
    try:
        for rank, name in enumerate(("ps", "ss", "worker1", "worker2")):
            ranks.start(rank, name)
        ranks.wait_event("ps", "ps_round", 120.0, version=2)
        ranks.kill("ss")
        ranks.wait("ss", 10.0)
        ranks.wait_event("ps", "ps_round", 60.0, version=4)  # two rounds closed with the state server down
        ranks.start(1, "ss", args=("--append",))
        for name in ("ps", "ss", "worker1", "worker2"):
            assert ranks.wait(name, 120.0) == 0, ranks.logs()
        real = read_summary(tmp_path / "ps")
    finally:
        ranks.close()
    assert real["rounds"] == 12 and real["stop_reason"] == "done" and real["rounds_failed"] == 0
    rounds = {e["version"]: e["iterations"] for e in ranks.events("ps") if e["kind"] == "ps_round"}
    assert sorted(rounds) == list(range(12))
    assert rounds[4]["worker1"] == 1, rounds  # no answer: SYNC after the first iteration (round 3: the kill)
    assert rounds[11]["worker1"] >= 3, rounds  # answered again after the restart: ESync fills the time
    ends = [e for e in ranks.events("ss") if e["kind"] == "ss_end"]
    assert len(ends) == 1 and ends[0]["queries"] > 0  # the second life answered (the first never ended)
