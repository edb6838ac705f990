"""Sites joining a geo run for real (issue 11, core.geo.join): ``real launch`` (one process per
rank, CycloneDDS on loopback, --time-scale 1), the same scenario as emu.  Slow: six processes.

When a late site's JOIN reaches the global PS depends on the machine, so the round it joins at
does too.  What does not: it joins, it counts from the next round, every model agrees, and the
model is emu's for the same scenario once emu's site comes up within that same round.  Likewise
for a local PS killed and started again while its worker stays up: which round it dies in is the
machine's, and emu, with its PS killed at the same point of the protocol, ends with the same model.
"""

import subprocess
import sys

import pytest

pytest.importorskip("cyclonedds")

from dtemu.core.scenario import parse_scenario  # noqa: E402
from dtemu.emu.run import run_emulation  # noqa: E402
from dtemu.host.rundir import read_events, read_summary  # noqa: E402
from helpers import ROOT, env, kill_group, needs_mnist, new_domain, scenario_file  # noqa: E402

pytestmark = [needs_mnist, pytest.mark.slow]

ROUNDS = 60
LATE = {
    "name": "real_geo_join", "mode": "geo", "seed": 2, "model": "small_cnn", "threads": 1,
    "data": {"partition": "iid", "test_samples": 300},
    "network": {"sites": {"central": {}, "a": {}, "b": {}}},
    # a round of about 0.1 s for real: the run is still going when site b comes up
    "compute": {"default": {"slowdown": 4}},
    "geo": {"workers_per_site": 1, "rounds": ROUNDS, "eval_every": 20, "batch_size": 32,
            "round_timeout_s": 30, "joining": True, "start_wait_s": 0.5},
}


def _offline(nodes, start, end):
    return [{"node": n, "start_s": start, **({"end_s": end} if end is not None else {})} for n in nodes]


def _launch(tmp_path, raw, timeout=150):
    """``real launch`` of ``raw``; its (summary, events)."""
    out = tmp_path / "real"
    args = [sys.executable, "-m", "dtemu.real.cli", "launch", str(scenario_file(tmp_path, raw)), "--out", str(out),
            "--no-tui", "--timeout", str(timeout - 10), "--threads", "1", "--time-scale", "1",
            "--domain", str(new_domain())]
    proc = subprocess.Popen(args, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail(f"real launch of {raw['name']} did not end in {timeout} s")
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    return read_summary(out), read_events(out)


def _emu(tmp_path, name, raw):
    return run_emulation(parse_scenario(raw), tmp_path / name), read_events(tmp_path / name)


def _closes(events, node="global-ps"):
    return {e["round"]: e for e in events if e["kind"] == "geo_round" and e["node"] == node}


def test_a_late_site_joins_for_real_and_ends_with_emus_model(tmp_path):
    site_b = ("b-ps", "b-w0")
    raw = {**LATE, "faults": {"offline": _offline(site_b, 0, 1.5)}}
    real, events = _launch(tmp_path, raw)
    assert real["stop_reason"] == "done" and real["rounds"] == ROUNDS and real["lost"] == []
    assert real["models_agree"] and real["survivors"] == 2
    gps = [e for e in events if e["node"] == "global-ps"]
    # the start: b was not up within start_wait_s; the run went on with a
    (lost,) = [e for e in gps if e["kind"] == "geo_lost"]
    assert lost["round"] == 0 and lost["missing"] == ["b-ps"] and lost["reason"].startswith("not up at the start")
    # b came up at its window's end (held by the launcher while it loaded), not seconds later
    (up,) = [e for e in events if e["node"] == "b-ps" and e["kind"] == "node_up"]
    assert 1.5 <= up["t"] < 6
    # b's JOIN came over DDS and b was let in when the round in progress closed
    (joined,) = [e for e in gps if e["kind"] == "geo_join"]
    k, closes = joined["round"], _closes(events)
    assert joined["ps"] == "b-ps" and 1 <= k < ROUNDS and closes[k]["t"] <= joined["t"] and up["t"] < closes[k]["t"]
    # counted from the next round: b's worker steps from k + 1, and the global PS sums two sites
    steps = [e["round"] for e in events if e["kind"] == "geo_step" and e["node"] == "b-w0"]
    assert steps == list(range(k + 1, ROUNDS + 1))
    assert closes[k + 1]["bytes_up"] == 2 * closes[k]["bytes_up"]

    # emu, with b up in round k too: its rounds without b (b never up) say when that is
    _, alone = _emu(tmp_path, "alone", {**LATE, "faults": {"offline": _offline(site_b, 0, None)}})
    before = LATE["geo"]["start_wait_s"] if k == 1 else _closes(alone)[k - 1]["t"]
    emu, emu_events = _emu(tmp_path, "emu", {**LATE, "faults": {"offline": _offline(site_b, 0, before + 0.001)}})
    assert [e["round"] for e in emu_events if e["kind"] == "geo_join"] == [k]
    assert emu["models_agree"] and real["model_sha256"] == emu["model_sha256"]
    assert real["final_accuracy"] == emu["final_accuracy"] and real["wan_bytes"] == emu["wan_bytes"]


def test_a_killed_local_ps_restarts_for_real_and_brings_its_workers_back(tmp_path):
    # real launch SIGKILLs b's PS at 1.5 s and starts it again at 2 s (a fresh process: seconds of
    # start-up); its worker stays up, waiting for a pull.  Without heartbeats the global PS waits
    # (2 x 30 s) for b's push, so the JOIN of b's new life closes that round: the run stalls, it
    # does not lose b, whatever the start-up takes.
    raw = {**LATE, "faults": {"offline": _offline(["b-ps"], 1.5, 2.0)}}
    real, events = _launch(tmp_path, raw, timeout=200)
    assert real["stop_reason"] == "done" and real["rounds"] == ROUNDS and real["lost"] == []
    assert real["models_agree"] and real["survivors"] == 2
    assert not [e for e in events if e["kind"] == "geo_lost"]
    (killed,) = [e for e in events if e["node"] == "b-ps" and e.get("fault") == "killed"]
    (joined,) = [e for e in events if e["kind"] == "geo_join"]
    (rejoin,) = [e for e in events if e["kind"] == "geo_rejoin"]
    k, w = joined["round"], rejoin["waited"]
    assert rejoin["node"] == "b-w0" and rejoin["round"] == k and w in (k - 1, k) and killed["t"] < joined["t"]
    steps = [e["round"] for e in events if e["kind"] == "geo_step" and e["node"] == "b-w0"]
    assert steps == list(range(1, w)) + list(range(k + 1, ROUNDS + 1))

    # emu, with b's PS killed at the same point of the protocol: its rounds without a fault say when
    _, whole = _emu(tmp_path, "whole", LATE)
    if k == w:   # killed before it pushed round k: just after it handed out the pull of k - 1
        kill = _closes(whole, "b-ps")[k - 1]["t"]
    else:        # killed with its push of w at the global PS, before the pull of w came back
        kill = [e["t"] for e in whole if e["kind"] == "deliver" and e["node"] == "global-ps"
                and e["src"] == "b-ps" and e["bytes"] > 20][w - 1]
    restart = {**LATE, "faults": {"offline": _offline(["b-ps"], kill + 1e-6, kill + 0.5)}}
    emu, emu_events = _emu(tmp_path, "emu", restart)
    assert [(e["round"], e["waited"]) for e in emu_events if e["kind"] == "geo_rejoin"] == [(k, w)]
    assert emu["models_agree"] and real["model_sha256"] == emu["model_sha256"]
    assert real["final_accuracy"] == emu["final_accuracy"]


def test_a_late_site_joins_an_hfa_run_for_real_and_ends_with_emus_model(tmp_path):
    # HFA is synchronous at both levels, so deterministic: emu with b up in the same global round
    # ends with real's model.  k1 2, k2 2: a global round is 4 local steps and two local syncs.
    site_b = ("b-ps", "b-w0")
    hfa = {**LATE, "geo": {**LATE["geo"], "sync": "hfa", "k1": 2, "k2": 2, "rounds": 30}}
    raw = {**hfa, "faults": {"offline": _offline(site_b, 0, 1.5)}}
    real, events = _launch(tmp_path, raw)
    assert real["stop_reason"] == "done" and real["rounds"] == 30 and real["lost"] == []
    assert real["models_agree"] and real["survivors"] == 2
    (joined,) = [e for e in events if e["node"] == "global-ps" and e["kind"] == "geo_join"]
    k = joined["round"]
    assert 1 <= k < 30
    syncs = [e["round"] for e in events if e["kind"] == "geo_step" and e["node"] == "b-w0"]
    assert syncs == list(range(2 * k + 1, 2 * 30 + 1))   # from the first local sync of round k + 1

    _, alone = _emu(tmp_path, "alone", {**hfa, "faults": {"offline": _offline(site_b, 0, None)}})
    before = hfa["geo"]["start_wait_s"] if k == 1 else _closes(alone)[k - 1]["t"]
    emu, emu_events = _emu(tmp_path, "emu", {**hfa, "faults": {"offline": _offline(site_b, 0, before + 0.001)}})
    assert [e["round"] for e in emu_events if e["kind"] == "geo_join"] == [k]
    assert emu["models_agree"] and real["model_sha256"] == emu["model_sha256"]
    assert real["wan_bytes"] == emu["wan_bytes"]


def test_a_late_site_joins_a_mixedsync_run_for_real(tmp_path):
    # MixedSync is asynchronous between sites: which updates interleave is the machine's, so the
    # model is not emu's.  What must hold: b is let in at once, runs the rounds a had left, and the
    # master, sent fewer updates than rounds x sites, is told the end and stops without a loss.
    site_b = ("b-ps", "b-w0")
    mixed = {**LATE, "geo": {**LATE["geo"], "sync": "mixed"}}
    real, events = _launch(tmp_path, {**mixed, "faults": {"offline": _offline(site_b, 0, 1.5)}})
    assert real["stop_reason"] == "done" and real["lost"] == []
    assert not [e for e in events if e["kind"] == "geo_lost" and e["round"] > 0]
    (joined,) = [e for e in events if e["node"] == "global-ps" and e["kind"] == "geo_join"]
    b_rounds = [e["round"] for e in events if e["kind"] == "geo_round" and e["node"] == "b-ps"]
    a_rounds = [e["round"] for e in events if e["kind"] == "geo_round" and e["node"] == "a-ps"]
    assert a_rounds == list(range(1, ROUNDS + 1)) and b_rounds and b_rounds == list(range(b_rounds[0], ROUNDS + 1))
    ends = {e["node"]: e for e in events if e["kind"] == "geo_end"}
    assert ends["master"]["rounds"] == ends["global-ps"]["rounds"] == ROUNDS + len(b_rounds) < 2 * ROUNDS
    assert joined["t"] > 1.5
