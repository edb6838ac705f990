"""Sites joining a running geo run (issue 11, core.geo.join), in emu with exact virtual times.

Joining is on with ``geo.joining``.  A site is staged to come up late with ``faults.offline`` windows from 0 to its start time for its
local PS and workers; ``geo.start_wait_s`` is how long the global PS waits for every site at the start.
"""

from __future__ import annotations

import json

import pytest

from dtemu.core.geo.payload import END, HEADER_SIZE, JOIN, STATE, decode, encode_end, encode_join, encode_state, head
from dtemu.core.errors import GeoPayloadError
from dtemu.emu.run import run_emulation
from test_geo import StandIn, geo_scenario

import numpy as np


def _late(nodes, start, end=None):
    return json.dumps([{"node": n, "start_s": start, **({"end_s": end} if end is not None else {})} for n in nodes])


def _events(path):
    return [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]


def _run(tmp_path, name, **sets):
    sets = {"geo.rounds": 24, "geo.joining": "true", **sets}
    s = run_emulation(geo_scenario(**sets), tmp_path / name, work=StandIn())
    return s, _events(tmp_path / name)


SITE_B = ("b-ps", "b-w0", "b-w1")


@pytest.mark.parametrize("variant", ["none", "bisparse_fp16"])
def test_a_late_site_joins_with_the_current_model_and_counts_from_the_next_round(tmp_path, variant):
    s, events = _run(tmp_path, variant, **{"faults.offline": _late(SITE_B, 0, 0.5), "geo.start_wait_s": 0.2,
                                           "geo.compression": variant, "geo.dense_below": 100})
    assert s["stop_reason"] == "done" and s["rounds"] == 24 and s["lost"] == []
    # b's workers got the model (weights and momentum) the others had and stepped as they did
    assert s["models_agree"] and s["survivors"] == 4
    gps = [e for e in events if e["node"] == "global-ps"]
    # the start: the global PS waited geo.start_wait_s for b, then went on with a alone
    lost = [e for e in gps if e["kind"] == "geo_lost"]
    assert lost == [{"t": 0.2, "node": "global-ps", "kind": "geo_lost", "round": 0, "missing": ["b-ps"],
                     "reason": "not up at the start, going on without"}]
    # b is up at 0.5; its JOIN crosses both WANs (5 ms each) and is let in when the round in
    # progress closes, at that very instant
    (joined,) = [e for e in gps if e["kind"] == "geo_join"]
    closes = {e["round"]: e for e in gps if e["kind"] == "geo_round"}
    k = joined["round"]
    assert joined["site"] == "b" and joined["ps"] == "b-ps" and joined["t"] == closes[k]["t"]
    assert closes[k - 1]["t"] < 0.5 + 0.010 <= closes[k]["t"]
    # counted from the next round: a's push alone before, a's and b's after
    assert closes[k + 1]["bytes_up"] > closes[k]["bytes_up"]
    if variant == "none":
        assert closes[k + 1]["bytes_up"] == 2 * closes[k]["bytes_up"]
    steps = [e["round"] for e in events if e["kind"] == "geo_step" and e["node"] == "b-w0"]
    assert steps == list(range(k + 1, 25))
    # every WAN byte the roles counted is what the network carried, the JOINs and the STATE included
    net = s["emu"]["wan_bytes"]
    assert s["wan_bytes"] == sum(v["up"] for v in net.values()) == sum(v["down"] for v in net.values())


def test_a_site_back_before_it_was_given_up_rejoins_without_being_lost(tmp_path):
    # b goes down at 0.2 and is back at 0.5, well inside the global PS's 2 x 5 s wait for its push:
    # its new JOIN ends that wait at once (no geo_lost), and it is let in at the round's close.
    s, events = _run(tmp_path, "back", **{"faults.offline": _late(SITE_B, 0.2, 0.5)})
    assert s["stop_reason"] == "done" and s["lost"] == [] and s["models_agree"] and s["survivors"] == 4
    gps = [e for e in events if e["node"] == "global-ps"]
    assert not [e for e in gps if e["kind"] == "geo_lost"]
    (joined,) = [e for e in gps if e["kind"] == "geo_join"]
    assert 0.5 < joined["t"] < 0.6 and s["time_s"] < 2


def test_without_joining_a_late_site_is_given_up_as_before(tmp_path):
    s, events = _run(tmp_path, "off", **{"faults.offline": _late(SITE_B, 0, 0.5), "geo.joining": "false"})
    # the global PS gives b up in round 1; b's PS, up at 0.5, never gets the model and gives up too
    assert s["stop_reason"] == "done" and s["lost"] == ["b-ps", "global-ps"] and s["survivors"] == 2
    assert not [e for e in events if e["kind"] == "geo_join"]


def test_a_site_that_never_comes_is_reported_at_the_start(tmp_path):
    s, events = _run(tmp_path, "never", **{"faults.offline": _late(SITE_B, 0), "geo.start_wait_s": 0.2,
                                           "geo.rounds": 12})
    assert s["stop_reason"] == "done" and s["rounds"] == 12 and s["lost"] == ["b-ps"] and s["survivors"] == 2
    assert not [e for e in events if e["kind"] == "geo_join"]


def test_join_and_state_payloads_are_checked():
    assert decode(encode_join(10), 10).kind == JOIN
    w, m = np.arange(10, dtype=np.float32), np.ones(10, np.float32)
    st = decode(encode_state(7, w, m), 10)
    assert st.kind == STATE and st.round == 7 and np.array_equal(st.dense(), w) and np.array_equal(st.momentum, m)
    assert decode(encode_state(7, w), 10).momentum is None
    end = decode(encode_end(10, 41), 10)
    assert end.kind == END and end.round == 41 and end.values.size == 0
    for raw, why in [(head(JOIN, 0, 0, 10, 1) + b"\0" * 8, "join with 1 entries"),
                     (encode_state(1, w, m)[:-4], "state body"),
                     (head(STATE, 3, 1, 10, 10) + b"\0" * 120, "3 vectors"),
                     (encode_end(10, 3) + b"\0" * 8, "end with 0 entries and 8 body"),
                     (encode_state(1, np.full(10, np.inf, np.float32)), "not finite")]:
        with pytest.raises(GeoPayloadError, match=why):
            decode(raw, 10)


def test_a_state_is_refused_by_a_member_in_the_middle_of_its_run():
    from dtemu.core.geo.common import GeoResult
    from dtemu.core.geo.receiver import Receiver
    from dtemu.core.runtime.requests import Message, RecordingContext
    ctx = RecordingContext(node="a-w0")
    inbox = Receiver(ctx, "geo/pull", 10, {"a-ps": "a", "a-w0": "a"}, "a", GeoResult(role="worker", site="a"))
    gen = inbox.collect(["a-ps"], 3, deadline=5.0)
    next(gen)
    gen.send(Message("geo/pull", "a-ps", encode_state(3, np.ones(10, np.float32))))
    assert [e["reason"] for e in ctx.events] == ["unexpected_state"]


def test_joining_is_refused_with_the_flat_ps():
    from dtemu.core.errors import ScenarioError
    with pytest.raises(ScenarioError, match="geo.joining"):
        geo_scenario(**{"geo.joining": "true", "geo.architecture": "flat"})


# --- a local PS that starts again while its workers stay up ------------------------------------
def _rejoins(events, k):
    """Both of b's workers took the model of round k that their restarted PS forwarded."""
    rejoins = {e["node"]: e for e in events if e["kind"] == "geo_rejoin"}
    assert sorted(rejoins) == ["b-w0", "b-w1"] and {e["round"] for e in rejoins.values()} == {k}
    (waited,) = {e["waited"] for e in rejoins.values()}
    return rejoins, waited


@pytest.mark.parametrize("variant", ["none", "bisparse_fp16"])
def test_a_local_ps_that_starts_again_brings_its_waiting_workers_back(tmp_path, variant):
    # b's PS alone is down from 0.2 to 0.5 s (its workers stay up, waiting for their pull);
    # the global PS waits 2 x 5 s for b's push, so b is back well inside that wait
    s, events = _run(tmp_path, variant, **{"faults.offline": _late(["b-ps"], 0.2, 0.5),
                                           "geo.compression": variant, "geo.dense_below": 100})
    assert s["stop_reason"] == "done" and s["rounds"] == 24 and s["lost"] == []
    assert s["models_agree"] and s["survivors"] == 4 and s["time_s"] < 2   # no timeout waited out
    gps = [e for e in events if e["node"] == "global-ps"]
    assert not [e for e in events if e["kind"] == "geo_lost"]
    # the PS's new JOIN ends the global PS's wait for its push: the round closes with site a and
    # b is let in at that instant with the model of that round
    (joined,) = [e for e in gps if e["kind"] == "geo_join"]
    k, closes = joined["round"], {e["round"]: e for e in gps if e["kind"] == "geo_round"}
    assert joined["ps"] == "b-ps" and joined["t"] == closes[k]["t"] and 0.5 + 0.010 <= joined["t"] < 0.6
    assert closes[k]["bytes_up"] * 2 == closes[k - 1]["bytes_up"] == closes[k + 1]["bytes_up"] if variant == "none" \
        else closes[k]["bytes_up"] < closes[k + 1]["bytes_up"]
    # b's workers, still waiting for the pull of the round their PS died in (it had pushed that
    # round's sum, so the global PS closed it with b and waited for b in the next), take the STATE
    # their PS forwards when the global PS's STATE has crossed both WANs, and step from k + 1
    rejoins, waited = _rejoins(events, k)
    assert waited == k - 1 and all(closes[k]["t"] + 0.010 < e["t"] < closes[k + 1]["t"] for e in rejoins.values())
    down = next(e["t"] for e in events if e["kind"] == "node_down")
    assert closes[waited]["t"] < down == 0.2 < closes[k]["t"]
    steps = [e["round"] for e in events if e["kind"] == "geo_step" and e["node"] == "b-w0"]
    assert steps == list(range(1, waited)) + list(range(k + 1, 25))


def test_a_dead_local_ps_is_found_by_heartbeats_reported_and_let_back_in(tmp_path):
    # with heartbeats every 0.1 s the global PS gives b up 0.3 s after its last beat and goes on
    # with a; b's PS is back at 0.6 s, joins anew, and its workers (waiting 5 x 5 s for a pull) with it
    s, events = _run(tmp_path, "beats", **{"faults.offline": _late(["b-ps"], 0.2, 0.6), "geo.heartbeat_s": 0.1})
    assert s["stop_reason"] == "done" and s["rounds"] == 24 and s["lost"] == []
    assert s["models_agree"] and s["survivors"] == 4
    gps = [e for e in events if e["node"] == "global-ps"]
    (lost,) = [e for e in gps if e["kind"] == "geo_lost"]
    assert lost["missing"] == ["b-ps"] and lost["reason"] == "heartbeat, going on without"
    # three beats (0.3 s) after the global PS last heard b's PS: its push just before it died at 0.2
    heard = max(e["t"] for e in events if e["kind"] == "deliver" and e["node"] == "global-ps"
                and e["src"] == "b-ps" and e["t"] < 0.2)
    assert lost["t"] == pytest.approx(heard + 0.3, abs=1e-9)
    (joined,) = [e for e in gps if e["kind"] == "geo_join"]
    assert 0.6 < joined["t"] < 0.7 and joined["round"] > lost["round"]
    rejoins, waited = _rejoins(events, joined["round"])
    assert waited <= lost["round"] < joined["round"]   # they waited for a round b's PS died in


def test_a_restarted_ps_without_joining_leaves_its_workers_waiting_as_before(tmp_path):
    s, events = _run(tmp_path, "off", **{"faults.offline": _late(["b-ps"], 0.2, 0.5), "geo.joining": "false",
                                         "geo.rounds": 8})
    # the global PS gives b up after 2 x 5 s; b's new PS waits for an initial model that never comes
    assert s["lost"] and "b-ps" in s["lost"] and s["survivors"] == 2
    assert not [e for e in events if e["kind"] in ("geo_join", "geo_rejoin")]


def test_a_state_in_the_middle_of_a_round_is_taken_only_from_the_restarted_ps_and_never_older():
    from dtemu.core.geo.common import GeoResult
    from dtemu.core.geo.receiver import Receiver
    from dtemu.core.runtime.requests import Message, RecordingContext
    ctx = RecordingContext(node="a-w0")
    inbox = Receiver(ctx, "geo/pull", 10, {"a-ps": "a", "a-w0": "a", "global-ps": "c"}, "a",
                  GeoResult(role="worker", site="a"))
    inbox.news.restarts = "a-ps"
    gen = inbox.collect(["a-ps"], 3, deadline=5.0)
    next(gen)
    gen.send(Message("geo/pull", "a-ps", encode_state(2, np.ones(10, np.float32))))      # an older model
    gen.send(Message("geo/pull", "global-ps", encode_state(3, np.ones(10, np.float32))))  # not its PS
    assert [e["reason"] for e in ctx.events] == ["unexpected_state", "unknown_sender"]
    with pytest.raises(StopIteration) as done:
        gen.send(Message("geo/pull", "a-ps", encode_state(4, np.ones(10, np.float32))))
    payload, _ = done.value.value["a-ps"]
    assert payload.kind == STATE and payload.round == 4


# --- HFA (K1 local steps, K2 local syncs, then a global one) -------------------------------------
HFA = {"geo.sync": "hfa", "geo.k1": 2, "geo.k2": 3, "geo.rounds": 16}   # a global round: ~36 ms


def _hfa_closes(events):
    return {e["round"]: e for e in events if e["kind"] == "geo_round" and e["node"] == "global-ps"}


def test_a_late_site_joins_an_hfa_run_at_a_global_round(tmp_path):
    s, events = _run(tmp_path, "hfa", **HFA, **{"faults.offline": _late(SITE_B, 0, 0.3), "geo.start_wait_s": 0.2})
    assert s["stop_reason"] == "done" and s["rounds"] == 16 and s["lost"] == []
    # every worker ends a round with the global average: b's too, from the round after it joined
    assert s["models_agree"] and s["survivors"] == 4
    gps = [e for e in events if e["node"] == "global-ps"]
    (lost,) = [e for e in gps if e["kind"] == "geo_lost"]
    assert lost["round"] == 0 and lost["missing"] == ["b-ps"] and lost["t"] == 0.2
    (joined,) = [e for e in gps if e["kind"] == "geo_join"]
    k, closes = joined["round"], _hfa_closes(events)
    assert joined["ps"] == "b-ps" and joined["t"] == closes[k]["t"]
    # let in at the close of the round whose wait for pushes took its JOIN (20 bytes, up at 0.3)
    (hello,) = [e["t"] for e in events if e["kind"] == "deliver" and e["node"] == "global-ps" and e["src"] == "b-ps"
                and e["bytes"] == HEADER_SIZE]
    collected = {r: c["t"] - c["wan_s"] for r, c in closes.items()}   # when each round's pushes were in
    assert 0.3 + 0.010 < hello and collected[k - 1] < hello <= collected[k]
    # from round k + 1 the global PS averages both sites
    assert closes[k + 1]["bytes_up"] == 2 * closes[k]["bytes_up"]
    # b's workers start at the first local sync of round k + 1 (syncs are (r - 1) * k2 + j)
    syncs = [e["round"] for e in events if e["kind"] == "geo_step" and e["node"] == "b-w0"]
    assert syncs == list(range(k * 3 + 1, 16 * 3 + 1))
    ends = {e["node"]: e for e in events if e["kind"] == "geo_end"}
    assert ends["b-w0"]["rounds"] == ends["a-w0"]["rounds"] == 16
    net = s["emu"]["wan_bytes"]
    assert s["wan_bytes"] == sum(v["up"] for v in net.values()) == sum(v["down"] for v in net.values())


def test_sites_joining_an_hfa_run_later_join_later_and_change_the_model(tmp_path):
    s1, e1 = _run(tmp_path, "early", **HFA, **{"faults.offline": _late(SITE_B, 0, 0.25), "geo.start_wait_s": 0.2})
    s2, e2 = _run(tmp_path, "late", **HFA, **{"faults.offline": _late(SITE_B, 0, 0.4), "geo.start_wait_s": 0.2})
    (j1,) = [e["round"] for e in e1 if e["kind"] == "geo_join"]
    (j2,) = [e["round"] for e in e2 if e["kind"] == "geo_join"]
    assert j1 < j2 and s1["models_agree"] and s2["models_agree"] and s1["model_sha256"] != s2["model_sha256"]


def test_an_hfa_local_ps_that_starts_again_brings_its_waiting_workers_back(tmp_path):
    s, events = _run(tmp_path, "hfa", **HFA, **{"faults.offline": _late(["b-ps"], 0.25, 0.35)})
    assert s["stop_reason"] == "done" and s["rounds"] == 16 and s["lost"] == []
    assert s["models_agree"] and s["survivors"] == 4 and s["time_s"] < 3   # no timeout waited out
    assert not [e for e in events if e["kind"] == "geo_lost"]
    (joined,) = [e for e in events if e["kind"] == "geo_join"]
    k = joined["round"]
    rejoins = {e["node"]: e for e in events if e["kind"] == "geo_rejoin"}
    # the STATE carries the sync id of round k's global sync; the workers waited for a sync of the
    # round their PS died in (k - 1 if it had pushed that round's average up, as in FSA; else k)
    # and go on from round k + 1
    assert sorted(rejoins) == ["b-w0", "b-w1"] and {e["round"] for e in rejoins.values()} == {k * 3}
    (waited,) = {e["waited"] for e in rejoins.values()}
    assert (k - 2) * 3 < waited <= k * 3
    syncs = [e["round"] for e in events if e["kind"] == "geo_step" and e["node"] == "b-w0"]
    assert syncs == list(range(1, waited)) + list(range(k * 3 + 1, 16 * 3 + 1))


# --- MixedSync (synchronous in a site, asynchronous between sites) ------------------------------
MIXED = {"geo.sync": "mixed", "geo.rounds": 24}


def test_a_late_site_joins_a_mixedsync_run_at_once_and_runs_the_rounds_left(tmp_path):
    s, events = _run(tmp_path, "mixed", **MIXED, **{"faults.offline": _late(SITE_B, 0, 0.3), "geo.start_wait_s": 0.2})
    assert s["stop_reason"] == "done" and s["lost"] == [] and s["survivors"] == 4
    gps = [e for e in events if e["node"] == "global-ps"]
    (joined,) = [e for e in gps if e["kind"] == "geo_join"]
    (hello,) = [e["t"] for e in events if e["kind"] == "deliver" and e["node"] == "global-ps" and e["src"] == "b-ps"
                and e["bytes"] == HEADER_SIZE]
    assert joined["ps"] == "b-ps" and joined["t"] == hello   # asynchronous: no round to wait for
    # b runs the rounds site a had left when it joined (a's next round, on), so both end together
    a_rounds = [e["round"] for e in events if e["kind"] == "geo_round" and e["node"] == "a-ps"]
    b_rounds = [e["round"] for e in events if e["kind"] == "geo_round" and e["node"] == "b-ps"]
    a_done_before = max(e["round"] for e in events if e["kind"] == "geo_round" and e["node"] == "a-ps"
                        and e["t"] <= hello)
    assert a_rounds == list(range(1, 25)) and b_rounds[0] in (a_done_before + 1, a_done_before + 2)
    assert b_rounds == list(range(b_rounds[0], 25))
    # the global PS made one update per push, and the master followed every one, then was told the end
    ends = {e["node"]: e for e in events if e["kind"] == "geo_end"}
    assert ends["global-ps"]["rounds"] == 24 + len(b_rounds) == ends["master"]["rounds"] < 48
    assert not [e for e in events if e["kind"] == "geo_lost" and e["node"] == "master"]
    net = s["emu"]["wan_bytes"]
    assert s["wan_bytes"] == sum(v["up"] for v in net.values()) == sum(v["down"] for v in net.values())


def test_a_mixedsync_local_ps_that_starts_again_skips_the_round_it_died_in(tmp_path):
    s, events = _run(tmp_path, "mixed", **MIXED, **{"faults.offline": _late(["b-ps"], 0.2, 0.5)})
    assert s["stop_reason"] == "done" and s["lost"] == [] and s["survivors"] == 4
    (joined,) = [e for e in events if e["kind"] == "geo_join"]
    rejoins = {e["node"]: e for e in events if e["kind"] == "geo_rejoin"}
    assert sorted(rejoins) == ["b-w0", "b-w1"]
    (k,) = {e["round"] for e in rejoins.values()}
    (waited,) = {e["waited"] for e in rejoins.values()}
    # k == waited: its push of that round died with it; k == waited + 1: the global PS had it
    assert k in (waited, waited + 1)
    b_rounds = [e["round"] for e in events if e["kind"] == "geo_round" and e["node"] == "b-ps"]
    assert b_rounds == list(range(1, waited)) + list(range(k + 1, 25))
    ends = {e["node"]: e for e in events if e["kind"] == "geo_end"}
    assert ends["master"]["rounds"] == ends["global-ps"]["rounds"] == 24 + len(b_rounds) + (k - waited)


def test_a_mixedsync_master_is_told_the_end_when_a_site_was_lost(tmp_path):
    s, events = _run(tmp_path, "lost", **{"geo.sync": "mixed", "faults.offline": _late(["b-ps"], 0.05)})
    assert s["stop_reason"] == "done" and "b-ps" in s["lost"] and "global-ps" not in s["lost"]
    master = [e for e in events if e["node"] == "master"]
    assert not [e for e in master if e["kind"] == "geo_lost"]
    gps_end = next(e["t"] for e in events if e["kind"] == "geo_end" and e["node"] == "global-ps")
    assert next(e["t"] for e in master if e["kind"] == "geo_end") < gps_end + 1   # not 3 round timeouts later


def test_a_duplicated_join_does_not_make_a_mixedsync_site_skip_a_round(tmp_path):
    # every message duplicated: the late site's JOIN arrives twice; it is let in once, and runs
    # every round it was given (a second admission would skip one and strand its PS)
    s, events = _run(tmp_path, "dup", **MIXED, **{"faults.offline": _late(SITE_B, 0, 0.3), "geo.start_wait_s": 0.2,
                                                  "faults.duplicate_p": 1.0})
    assert s["stop_reason"] == "done" and s["lost"] == []
    assert len([e for e in events if e["kind"] == "geo_join"]) == 1
    b_rounds = [e["round"] for e in events if e["kind"] == "geo_round" and e["node"] == "b-ps"]
    assert b_rounds and b_rounds == list(range(b_rounds[0], 25))
