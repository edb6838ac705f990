"""geo's inbox with no I/O (core.geo.inbox): each payload offered gets its verdict, and the state
(the round's takings, what came early, who said JOIN, where END put the last round) follows."""

from __future__ import annotations

import numpy as np

from dtemu.core.geo.inbox import PayloadInbox
from dtemu.core.runtime.verdict import ACCEPTED, EARLY, ENDED, NOTED, REFUSED
from dtemu.core.geo.payload import decode, encode_beat, encode_dense, encode_end, encode_join, encode_state

DIM = 4
SITES = {"a-ps": "a", "b-ps": "b", "global-ps": "c", "master": "c"}


def push(round_):
    raw = encode_dense(round_, np.ones(DIM, np.float32))
    return decode(raw, DIM), raw


def payload(raw):
    return decode(raw, DIM), raw


def test_a_round_takes_each_sender_once_and_keeps_later_rounds():
    inbox = PayloadInbox(SITES, "c")
    assert inbox.open(["a-ps", "b-ps"], 2, now=0.0)
    early = inbox.offer("a-ps", *push(3), now=0.1)
    assert early.kind == EARLY and early.wan
    assert inbox.offer("a-ps", *push(1), now=0.2).reason == "stale"
    assert inbox.offer("a-ps", *push(2), now=0.3).kind == ACCEPTED
    assert inbox.offer("a-ps", *push(2), now=0.4).reason == "duplicate"
    assert inbox.pending() == ["b-ps"]
    assert inbox.offer("b-ps", *push(2), now=0.5).kind == ACCEPTED and inbox.pending() == []
    # the push of round 3 that came early is taken as soon as round 3 opens
    assert inbox.open(["a-ps", "b-ps"], 3, now=1.0)
    assert list(inbox.got) == ["a-ps"] and inbox.pending() == ["b-ps"]


def test_wan_bytes_count_only_from_another_site_and_not_for_the_initial_model():
    inbox = PayloadInbox(SITES, "c")
    inbox.open(["master", "a-ps"], 1, now=0.0)
    assert inbox.offer("master", *push(1), now=0.0).wan is False     # same site
    assert inbox.offer("a-ps", *push(1), now=0.0).wan is True
    inbox.open(["a-ps"], 0, now=0.0, count_wan=False)
    assert inbox.offer("a-ps", *push(0), now=0.0).wan is False


def test_joins_beats_and_outsiders():
    inbox = PayloadInbox(SITES, "c")
    inbox.joinable = {"b-ps"}
    inbox.open(["a-ps"], 4, now=0.0)
    assert not inbox.admits("evil", ["a-ps"]) and inbox.admits("b-ps", ["a-ps"])
    assert inbox.offer("b-ps", *payload(encode_join(DIM)), now=1.0).kind == NOTED
    assert inbox.offer("b-ps", *push(4), now=1.5).reason == "unknown_sender"   # not a member yet
    assert inbox.offer("a-ps", *payload(encode_beat(DIM)), now=2.0).kind == NOTED
    assert inbox.offer("a-ps", *payload(encode_join(DIM)), now=2.5).kind == NOTED   # a member that started again
    assert inbox.joins == ["b-ps", "a-ps"] and inbox.pending() == []   # a-ps will not push this round
    assert inbox.heard == {"a-ps": 2.5, "b-ps": 1.5}


def test_a_state_answers_only_a_wait_for_the_model_or_the_restarted_ps():
    inbox = PayloadInbox(SITES, "a")
    state = payload(encode_state(3, np.ones(DIM, np.float32)))
    inbox.open(["a-ps"], 3, now=0.0)
    assert inbox.offer("a-ps", *state, now=0.0).reason == "unexpected_state"
    inbox.restarts = "a-ps"
    assert inbox.offer("a-ps", *payload(encode_state(2, np.ones(DIM, np.float32))), now=0.0).kind == REFUSED
    assert inbox.offer("a-ps", *state, now=0.0).kind == ACCEPTED


def test_end_stops_a_wait_for_a_round_the_run_will_not_make():
    inbox = PayloadInbox(SITES, "c")
    inbox.open(["global-ps"], 5, now=0.0)
    assert inbox.offer("global-ps", *payload(encode_end(DIM, 4)), now=0.0).kind == ENDED
    assert inbox.end == 4 and not inbox.open(["global-ps"], 6, now=1.0)


def test_silence_and_when_to_wake():
    inbox = PayloadInbox(SITES, "c")
    inbox.watch = 1.0
    inbox.open(["a-ps", "b-ps"], 1, now=10.0)
    inbox.offer("a-ps", *push(1), now=11.0)
    assert inbox.wake(deadline=20.0, beat_next=12.5) == 12.5
    assert inbox.wake(deadline=20.0, beat_next=None) == 13.0   # b-ps: 3 beats after 10.0
    assert not inbox.silent(12.9) and inbox.loss_reason == "timeout"
    assert inbox.silent(13.0) and inbox.loss_reason == "heartbeat"


def test_mixedsync_takes_the_first_push_of_any_sites_next_round():
    inbox = PayloadInbox(SITES, "c")
    expected = {"a-ps": 2, "b-ps": 1}
    assert inbox.offer_next("a-ps", *push(3), expected).kind == EARLY
    assert inbox.offer_next("a-ps", *push(3), expected).reason == "duplicate"
    assert inbox.offer_next("b-ps", *push(0), expected).reason == "stale"
    assert inbox.offer_next("b-ps", *push(1), expected).kind == ACCEPTED
    assert inbox.offer_next("b-ps", *payload(encode_join(DIM)), expected).kind == NOTED   # not joining
    inbox.joinable = {"b-ps"}
    assert inbox.offer_next("b-ps", *payload(encode_join(DIM)), expected).kind == ACCEPTED
    assert inbox.take_early({"a-ps": 3})[0] == "a-ps" and inbox.take_early({"a-ps": 3}) is None
