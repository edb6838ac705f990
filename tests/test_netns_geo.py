"""Geo training for real over network namespaces, one per site, against emu (issue 11;
tools/netns_geo.py, docs/netns.md "Geo sites over namespaces").

The namespace tests are opt-in: ``pytest -m slow tests/test_netns_geo.py`` as root (about
1.5 minutes); skipped with a reason unless this process may create network namespaces, veth
pairs and tc tbf qdiscs, and Fashion-MNIST is there.  Everything they create is in namespaces
of their own on 10.231.0.0/24, with no route out, removed at the end.  The first test (how
rounds are timed from the events) is quick and needs nothing.
"""

import os
import subprocess
from pathlib import Path

import pytest

from helpers import DATA

ROOT = Path(__file__).resolve().parent.parent
HAVE_FMNIST = (Path(os.environ.get("DTEMU_DATA", DATA)) / "FashionMNIST" / "raw").is_dir()


def _events(closes, computes, waits):
    out = [{"t": t, "node": "global-ps", "kind": "geo_round", "role": "global_ps", "round": r, "wan_s": 0.0}
           for r, t in closes.items()]
    out += [{"t": 0.0, "node": w, "kind": "geo_step", "round": r, "compute_s": c}
            for w, per in computes.items() for r, c in per.items()]
    out += [{"t": 0.0, "node": f"{s}-ps", "kind": "geo_round", "role": "local_ps", "round": r, "wan_s": v}
            for s, per in waits.items() for r, v in per.items()]
    return out


def test_round_times_and_comm_from_the_events():
    from tools.netns_geo import compare, round_times

    real = _events({1: 1.0, 2: 1.2, 3: 1.5}, {"a-w0": {2: 0.05, 3: 0.05}, "b-w0": {2: 0.1, 3: 0.02}},
                   {"a": {2: 0.1, 3: 0.2}, "b": {2: 0.1, 3: 0.2}})
    emu = _events({1: 0.5, 2: 0.7, 3: 1.0}, {"a-w0": {2: 0.05, 3: 0.05}, "b-w0": {2: 0.1, 3: 0.02}},
                  {"a": {2: 0.1, 3: 0.1}, "b": {2: 0.1, 3: 0.3}})
    assert round_times(real) == pytest.approx({2: 0.2, 3: 0.3})   # close to close; round 1 has no start
    cmp = compare(real, emu)
    assert [r["round"] for r in cmp["rounds"]] == [2, 3]
    r2 = cmp["rounds"][0]
    assert r2["real_comm_s"] == pytest.approx(0.1)   # minus the slowest worker's compute (b-w0)
    assert r2["error_pct"] == pytest.approx(0.0)
    assert cmp["rounds"][1]["real_wan_s"] == pytest.approx(0.2) and cmp["rounds"][1]["emu_wan_s"] == pytest.approx(0.2)
    assert cmp["mean"]["abs_error_pct"] == pytest.approx(0.0)


@pytest.fixture
def netns_ok(monkeypatch):
    from tools.netns_fl import netns_available

    ok, why = netns_available()
    if not ok:
        pytest.skip(f"network namespaces not usable here: {why}")
    if not HAVE_FMNIST:
        pytest.skip("Fashion-MNIST archives not found (set DTEMU_DATA)")
    if not os.environ.get("DTEMU_DATA"):
        monkeypatch.setenv("DTEMU_DATA", DATA)


def _our_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    tag = f"dtgeo{os.getpid() % 100000}-"
    return {line.split()[0] for line in out.splitlines() if line.startswith(tag)}


@pytest.mark.slow
def test_site_testbed_shapes_each_wan_and_is_isolated(netns_ok):
    from tools.netns_geo import SiteTestbed

    with SiteTestbed(["central", "a", "b"], [(30, 40), (20, 25), (50, 60)]) as bed:
        assert _our_namespaces() == set(bed.created)
        for i, (up, down) in enumerate(bed.wan_mbps):
            p = subprocess.run(bed.exec_prefix(i) + ["ip", "route", "get", "1.1.1.1"], capture_output=True, text=True)
            assert p.returncode != 0   # no way out
            q = bed.qdisc_stats()
            assert f"rate {up}Mbit" in q[f"{bed.names[i]}:eth0"]          # the site's WAN uplink
            assert f"rate {down}Mbit" in q[f"{bed.switch}:p{i}"]          # and its downlink
        assert bed.lan["rtt_ms"] < 50 and bed.lan["mbps"] > 100
    assert not _our_namespaces()


@pytest.mark.slow
def test_two_rounds_over_namespaced_sites_end_with_emus_model(netns_ok, tmp_path):
    from tools.netns_geo import run

    result = run("scenarios/geo_hips.yaml", rounds=2, workers_per_site=1, mbps=20, out=tmp_path / "geo",
                 timeout_s=300, test_samples=300)
    assert not _our_namespaces()
    real = result["real_summary"]
    assert real["rounds"] == 2 and real["stop_reason"] == "done" and real["models_agree"]
    assert not real.get("lost")
    # FSA is deterministic: the real run over the sites ends with emu's model, whatever the timing.
    assert len(set(result["sha256"].values())) == 1 and real["model_sha256"]
    assert result["wan_bytes"]["real"] == result["wan_bytes"]["emu"]
    replay = result["compare_replay"]
    assert [r["round"] for r in replay["rounds"]] == [2]
    # Loose: one round on a shared box (docs/netns.md has the measured numbers).
    assert replay["mean"]["abs_error_pct"] < 40
    assert (tmp_path / "geo" / "netns_geo.md").read_text().count("| mean |") == 6


@pytest.mark.slow
def test_a_late_site_joins_over_namespaced_sites_and_ends_with_emus_model(netns_ok, tmp_path):
    from tools.netns_geo import run

    # rounds of ~0.1 s at 20 Mbit/s: site b, held until 3 s after the start line, joins mid-run
    result = run("scenarios/geo_hips.yaml", rounds=60, workers_per_site=1, mbps=20, out=tmp_path / "late",
                 timeout_s=300, test_samples=300, late_site="b", late_at_s=3.0)
    assert not _our_namespaces()
    real, late = result["real_summary"], result["late"]
    assert real["rounds"] == 60 and real["stop_reason"] == "done" and real["models_agree"] and not real.get("lost")
    assert 1 <= late["real_join_round"] < 60 and late["real_up_t"] >= 3.0
    # emu, with b up within the round real let it in at, joins it then and ends with real's model
    assert late["emu_join_rounds"] == [late["real_join_round"]]
    assert result["sha256"]["real"] == result["sha256"]["emu-replay"] != late["alone_model"]
    assert result["wan_bytes"]["real"] == result["wan_bytes"]["emu"]


def test_the_in_situ_factor_is_the_real_steps_over_the_replays(tmp_path):
    # no root: two hand-made event files, one local PS and one worker, two rounds; every step
    # of the "real" run is twice the replay's, so the factor is 2
    import json

    from tools.netns_geo import in_situ, step_times

    def events(k):
        out = []
        t = 0.0
        for r in (1, 2):
            t0 = t
            compute_end = t0 + 0.010
            push_at_ps = compute_end + k * 0.001                 # push: worker -> its PS
            sent_up = push_at_ps + k * 0.002                      # sum: the PS's work before its push
            pull_at_ps = sent_up + 0.005                          # the WAN (not a step)
            close = pull_at_ps + k * 0.0005                       # pull: decode at the PS
            pull_at_w = close + k * 0.0007 + 0.0001               # down + the LAN
            step = pull_at_w + k * 0.0003                         # apply
            out += [{"t": push_at_ps, "node": "a-ps", "kind": "deliver", "topic": "geo/push", "src": "a-w0"},
                    {"t": pull_at_ps, "node": "a-ps", "kind": "deliver", "topic": "geo/pull", "src": "global-ps"},
                    {"t": close, "node": "a-ps", "kind": "geo_round", "role": "local_ps", "round": r,
                     "wait_s": sent_up - (t0 if r == 1 else prev_close + k * 0.0007), "wan_s": close - sent_up},
                    {"t": pull_at_w, "node": "a-w0", "kind": "deliver", "topic": "geo/pull", "src": "a-ps"},
                    {"t": step, "node": "a-w0", "kind": "geo_step", "round": r, "compute_s": 0.010,
                     "comm_s": step - compute_end}]
            prev_close = close
            t = step + k * 0.0004                                  # batch: the next gradient starts
        return out

    for name, k in (("real", 2), ("emu-replay", 1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in sorted(
            events(k), key=lambda e: e["t"])))
    emu = step_times(json.loads(line) for line in (tmp_path / "emu-replay" / "events.jsonl").read_text().splitlines())
    assert emu["push"] == pytest.approx(0.001) and emu["sum"] == pytest.approx(0.002)
    assert emu["pull"] == pytest.approx(0.0005) and emu["apply"] == pytest.approx(0.0003)
    assert emu["batch"] == pytest.approx(0.0004) and emu["down"] == pytest.approx(0.0007)
    assert in_situ(tmp_path)["factor"] == pytest.approx(2.0)
