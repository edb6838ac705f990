"""Real mode end to end: ``real launch`` (one process per rank, CycloneDDS on
loopback) on small scenarios, and its fidelity to emu.

Every run uses a DDS domain of its own (from the pid and a counter), the
loopback profile (nothing leaves 127.0.0.1), one torch thread, the small CNN
and a few hundred samples per round; every subprocess is bounded by a timeout
and its whole process group is killed afterwards, whatever happened.
"""

import collections
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cyclonedds")

from dtemu.host.rundir import read_events, read_summary  # noqa: E402
from dtemu.core.scenario import parse_scenario  # noqa: E402
from dtemu.emu.run import run_emulation  # noqa: E402
from helpers import DATA, ROOT, env, kill_group, needs_mnist, new_domain, scenario_file  # noqa: E402

pytestmark = needs_mnist


@pytest.fixture(autouse=True)
def data_root(monkeypatch):
    monkeypatch.setenv("DTEMU_DATA", DATA)  # for the in-process emu runs



def real(args: list, timeout: float) -> subprocess.CompletedProcess:
    """``python -m dtemu.real.cli ARGS`` in a session of its own, killed with its children on timeout."""
    proc = subprocess.Popen([sys.executable, "-m", "dtemu.real.cli", *map(str, args)], cwd=ROOT, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"real {' '.join(map(str, args))} did not end in {timeout:g}s\n{err.decode()[-3000:]}")
    finally:
        kill_group(proc)  # the ranks a launcher left behind, if any
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def launch(scenario: Path, out: Path, timeout: float = 60.0, *overrides: str) -> subprocess.CompletedProcess:
    args = ["launch", scenario, "--out", out, "--no-tui", "--timeout", timeout - 10, "--threads", 1, "--time-scale", 1,
            "--domain", new_domain()]
    for o in overrides:
        args += ["--set", o]
    return real(args, timeout)


def logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(out.glob("rank*.log")))


# Deterministic and synchronous: every client in every round (min_clients = clients),
# timeouts far beyond what a round takes, no jitter.
FL = {
    "name": "real_fl",
    "seed": 3,
    "model": "small_cnn",
    "threads": 1,
    "data": {"partition": "iid", "test_samples": 500},
    "fl": {"clients": 2, "rounds": 2, "subset": 256, "batch_size": 32, "lr": 0.05, "codec": "sq8",
           "error_feedback": True, "min_clients": 2, "round_timeout_s": 40, "barrier_timeout_s": 30},
}

DDP = {
    "name": "real_ddp",
    "mode": "ddp",
    "seed": 1,
    "model": "small_cnn",
    "threads": 1,
    "data": {"partition": "iid", "test_samples": 500},
    "ddp": {"workers": 2, "epochs": 1, "max_steps": 20, "batch_size": 32, "lr": 0.05, "momentum": 0.9,
            "compression": "dgc", "density": 0.01, "warmup_steps_per_stage": 4, "window": 10,
            "step_timeout_s": 30, "barrier_timeout_s": 30},
}


@pytest.fixture(scope="module")
def fl_run(tmp_path_factory):
    """One real launch of FL, shared by the tests that read it."""
    folder = tmp_path_factory.mktemp("real_fl")
    out = folder / "run"
    done = launch(scenario_file(folder, FL), out)
    return folder, out, done


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real_ddp")
    out = folder / "run"
    done = launch(scenario_file(folder, DDP), out)
    return folder, out, done


# --- 1. FL over real launch ------------------------------------------------------------------


def test_fl_launch_runs_two_rounds(fl_run):
    _, out, done = fl_run
    assert done.returncode == 0, done.stderr + logs(out)
    summary = read_summary(out)
    for key in ("final_accuracy", "bytes_up", "bytes_down", "model_sha256", "wall_time_s", "rounds"):
        assert key in summary, key
    assert summary["runtime"] == "real" and summary["mode"] == "fl"
    assert summary["rounds"] == 2 and summary["rounds_failed"] == 0
    assert summary["final_accuracy"] > 0.3
    assert summary["real"]["exit_codes"] == {"0": 0, "1": 0, "2": 0}
    assert summary["updates"] == {"accepted": 4}
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > summary["bytes_up"]
    for rank, node in enumerate(("controller", "client1", "client2")):
        folder = out / f"rank{rank}"
        assert (folder / "events.jsonl").exists() and (folder / "scenario.json").exists()
        assert read_summary(folder)["node"] == node
    assert (out / "rank0" / "checkpoint.dtck").exists()
    # as in emu: the scenario and the latest checkpoint at the top (resume from RUN/checkpoint.dtck)
    assert (out / "checkpoint.dtck").read_bytes() == (out / "rank0" / "checkpoint.dtck").read_bytes()
    assert (out / "scenario.json").exists()
    events = read_events(out)
    kinds = collections.Counter(e["kind"] for e in events)
    assert kinds["aggregated"] == 2 and kinds["client_stop"] == 2 and kinds["run_end"] == 1
    # The merged events are in time order and come from every rank.
    assert {e["node"] for e in events} == {"controller", "client1", "client2"}


# --- 2. DDP with DGC over real launch --------------------------------------------------------


def test_ddp_dgc_launch_workers_agree(ddp_run):
    _, out, done = ddp_run
    assert done.returncode == 0, done.stderr + logs(out)
    summary = read_summary(out)
    assert summary["models_agree"] is True and summary["model_sha256"]
    assert summary["steps"] == 20 and summary["compression"] == "dgc"
    assert summary["real"]["exit_codes"] == {"0": 0, "1": 0}
    assert 0 < summary["final_accuracy"] <= 1
    ends = [e for e in read_events(out) if e["kind"] == "worker_end"]
    assert sorted(e["node"] for e in ends) == ["worker0", "worker1"]
    assert all(e["steps"] == 20 for e in ends)


# --- 3. Fidelity: emu and real run the same bytes to the same model ---------------------------


def _deliveries(events):
    return collections.Counter((e["node"], e["src"], e["topic"], e["bytes"]) for e in events if e["kind"] == "deliver")


def test_fl_real_matches_emu(fl_run):
    folder, out, done = fl_run
    assert done.returncode == 0, done.stderr + logs(out)
    emu = run_emulation(parse_scenario(FL), folder / "emu")
    real_summary = read_summary(out)
    assert real_summary["model_sha256"] == emu["model_sha256"]
    assert (real_summary["bytes_up"], real_summary["bytes_down"]) == (emu["bytes_up"], emu["bytes_down"])
    emu_events, real_events = read_events(folder / "emu"), read_events(out)

    def uploads(events):
        return sorted((e["node"], e["round"], e["bytes"]) for e in events if e["kind"] == "upload_start")

    assert uploads(real_events) == uploads(emu_events)
    assert len(uploads(real_events)) == 4
    assert _deliveries(real_events) == _deliveries(emu_events)
    aggregated = [(e["round"], e["model_sha256"]) for e in real_events if e["kind"] == "aggregated"]
    assert aggregated == [(e["round"], e["model_sha256"]) for e in emu_events if e["kind"] == "aggregated"]


def test_ddp_dgc_real_matches_emu(ddp_run):
    folder, out, done = ddp_run
    assert done.returncode == 0, done.stderr + logs(out)
    emu = run_emulation(parse_scenario(DDP), folder / "emu")
    real_summary = read_summary(out)
    assert real_summary["model_sha256"] == emu["model_sha256"]
    for key in ("steps", "bytes_up", "bytes_down", "bytes_per_step", "final_accuracy"):
        assert real_summary[key] == emu[key], key

    def steps(events):
        return sorted((e["node"], e["step"], e["bytes_sent"], e["bytes_received"])
                      for e in events if e["kind"] == "step")

    real_steps, emu_steps = steps(read_events(out)), steps(read_events(folder / "emu"))
    assert len(real_steps) == 40
    assert real_steps == emu_steps


# --- 4. The CLI refuses bad arguments --------------------------------------------------------


def test_run_refuses_a_bad_rank(tmp_path):
    scenario = scenario_file(tmp_path, FL)
    for rank in ("3", "-1"):
        done = real(["run", scenario, "--rank", rank, "--no-tui", "--out", tmp_path / "r",
                     "--domain", new_domain()], timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"--rank {rank} is out of range" in done.stderr and "ranks 0..2" in done.stderr
    assert not (tmp_path / "r").exists()


def test_run_and_launch_refuse_a_bad_set(tmp_path):
    scenario = scenario_file(tmp_path, FL)
    done = real(["run", scenario, "--rank", "0", "--no-tui", "--set", "fl.codec=int8",
                 "--domain", new_domain()], timeout=60)
    assert done.returncode == 2
    assert "fl.codec: expected one of fp32, q8, s4, sq8, got 'int8'" in done.stderr
    done = real(["launch", scenario, "--no-tui", "--out", tmp_path / "l", "--timeout", 20, "--time-scale", 1,
                 "--set", "compute.nodes.client9.slowdown=2", "--domain", new_domain()], timeout=60)
    assert done.returncode == 2
    assert "compute.nodes.client9" in done.stderr
    assert not (tmp_path / "l").exists()  # refused before any rank started
    done = real(["run", scenario, "--rank", "0", "--no-tui", "--out", tmp_path / "r",
                 "--set", f"fl.init_path={tmp_path / 'missing.dtck'}", "--domain", new_domain()], timeout=60)
    assert done.returncode == 2 and "fl.init_path" in done.stderr


def _sigint_as(disposition):
    """The child starts with SIGINT as given: SIG_DFL as from a terminal, SIG_IGN as every
    background job of a non-interactive shell (a script's `cmd &`, so CI's own runs may be)."""
    return lambda: signal.signal(signal.SIGINT, disposition)


@pytest.mark.parametrize("sig, code, launched", [(signal.SIGINT, 130, False), (signal.SIGTERM, 143, False),
                                                 (signal.SIGINT, 130, True)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-launched-from-background"])
def test_a_signal_stops_a_rank_cleanly(tmp_path, sig, code, launched):
    """A controller waiting at its barrier stops on Ctrl-C / SIGTERM with its exit code.

    ``real launch`` stops its ranks with SIGINT, so a launched rank hears it even when it
    inherited SIGINT ignored (a launcher started in the background of a script)."""
    scenario = scenario_file(tmp_path, FL)
    out = tmp_path / "r"
    extra = {"DTEMU_LAUNCHED": "1"} if launched else {}
    proc = subprocess.Popen([sys.executable, "-m", "dtemu.real.cli", "run", scenario, "--rank", "0", "--no-tui",
                             "--out", str(out), "--domain", str(new_domain())], cwd=ROOT, env={**env(), **extra},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_sigint_as(signal.SIG_IGN if launched else signal.SIG_DFL))
    try:
        events = out / "events.jsonl"
        for _ in range(300):  # until it is up and waiting for its clients (bounded: 30 s)
            if events.exists() and b"run_start" in events.read_bytes():
                break
            try:
                proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
        assert proc.poll() is None, proc.communicate()[1].decode()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == code, err.decode()
        assert "partial run in" in err.decode()
        assert (out / "scenario.json").exists()
    finally:
        kill_group(proc)


# --- 3. a server optimizer, sampled and sealed, ends with emu's model -----------------------------

FEDADAM = {**FL, "name": "real_fedadam",
           "fl": {**FL["fl"], "clients": 3, "sample": 2, "min_clients": 2, "codec": "q8", "algorithm": "fedadam",
                  "server_opt": {"eta": 0.003}}}


def launch_sealed(tmp_path, scenario: dict):
    """``real launch`` of ``scenario`` under --key-file; (its run folder, the key file)."""
    key = tmp_path / "key"
    key.write_bytes(b"a shared key of thirty-two bytes")
    out = tmp_path / "run"
    done = real(["launch", scenario_file(tmp_path, scenario), "--out", out, "--no-tui", "--timeout", 80,
                 "--threads", 1, "--time-scale", 1, "--domain", new_domain(), "--key-file", key], 90)
    assert done.returncode == 0, done.stderr + logs(out)
    return out, key


@pytest.mark.slow  # (the default run keeps under 10 minutes on 2 cores; issue 45)
def test_fedadam_q8_sampled_sealed_real_matches_emu(tmp_path):
    out, key = launch_sealed(tmp_path, FEDADAM)
    from dtemu.host.keys import load_key

    emu = run_emulation(parse_scenario(FEDADAM), tmp_path / "emu", key=load_key(str(key))[0])
    real_summary = read_summary(out)
    assert real_summary["rounds"] == emu["rounds"] == 2
    assert real_summary["model_sha256"] == emu["model_sha256"]
    asked = [e["clients"] for e in read_events(out) if e["kind"] == "sampled"]
    assert asked == [e["clients"] for e in read_events(tmp_path / "emu") if e["kind"] == "sampled"]
    assert all(len(c) == 2 for c in asked)
    assert [e["authenticated"] for e in read_events(out) if e["kind"] == "run_start"][0] is True


FEDASYNC = {**FEDADAM, "name": "real_fedasync",
            "fl": {**FEDADAM["fl"], "algorithm": "fedasync", "rounds": 4, "server_opt": {}, "min_clients": 1,
                   "fedasync": {"alpha": 0.6, "staleness": "poly"}}}


def test_fedasync_q8_sampled_sealed_runs_to_its_end_for_real(tmp_path):
    """Asynchronous: the order updates arrive in may differ from emu's; every version is made."""
    out, _ = launch_sealed(tmp_path, FEDASYNC)
    summary = read_summary(out)
    assert summary["rounds"] == 4 and summary["updates"]["accepted"] == 4 and summary["sealed"]
    from dtemu.report.audit import audit

    assert audit(out)["lost_data"] == 0


# --- the rules that were mode ps's, in FL, for real: TiFL's tiers (on wall time), DC-ASGD one at a time ---

PS_RULES_IN_FL = {
    "tifl": {"algorithm": "tifl", "rounds": 3, "min_clients": 1, "tifl": {"tiers": 2}},
    "dcasgd": {"algorithm": "dcasgd", "rounds": 4, "min_clients": 1, "dcasgd_lambda": 0.1},
    "esync": {"algorithm": "esync", "rounds": 3, "min_clients": 1, "esync": {"max_iterations": 30}},
}


# all slow (the default run keeps under 10 minutes; tests/test_clock_sync.py runs ESync for real, rank by rank)
@pytest.mark.parametrize("rule", [r if r == "fedasync" else pytest.param(r, marks=pytest.mark.slow)
                                  for r in sorted(PS_RULES_IN_FL)])
def test_a_ps_rule_in_fl_q8_sampled_sealed_runs_to_its_end_for_real(tmp_path, rule):
    """Their choices follow wall time (TiFL's tiers, the order updates arrive in), so emu's model is
    not the measure here: every round or version is made, sealed, and nothing is lost."""
    fl = {**FEDADAM["fl"], "server_opt": {}, **PS_RULES_IN_FL[rule]}
    out, _ = launch_sealed(tmp_path, {**FEDADAM, "name": f"real_{rule}", "fl": fl})
    summary = read_summary(out)
    assert summary["rounds"] == fl["rounds"] and summary["rounds_failed"] == 0 and summary["sealed"]
    from dtemu.report.audit import audit

    assert audit(out)["lost_data"] == 0
    if rule == "esync":   # the state server answered every question, sealed, and refused nothing
        ss = summary["state_server"]
        assert ss["queries"] == sum(ss["answers"].values()) > 0 and ss["rejected"] == {}
