"""geo's inbox with no I/O (core.runtime.inbox with geo's notes, core.geo.inbox): each payload
offered gets its verdict, and the state (the round's takings, what came early, who said JOIN, where
END put the last round) follows."""

from __future__ import annotations

import numpy as np

from dtemu.core.geo.inbox import geo_inbox
from dtemu.core.geo.payload import encode_beat, encode_dense, encode_end, encode_join, encode_state
from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, EARLY, ENDED, LATE, NOTED, REFUSED
from dtemu.core.wire.auth import Sealer

DIM = 4


def push(round_):
    return encode_dense(round_, np.ones(DIM, np.float32))


def inbox_of():
    news = geo_inbox(Sealer(None, "c"), "geo/push", DIM)
    return news, news.inbox


def collect(inbox, senders, round_):
    inbox.members = set(senders)
    return inbox.ask_round(senders, round_)


def test_a_round_takes_each_sender_once_and_keeps_later_rounds():
    news, inbox = inbox_of()
    collect(inbox, ["a-ps", "b-ps"], 2)
    assert inbox.offer("a-ps", push(3)).kind == EARLY
    assert inbox.offer("a-ps", push(3)).kind == DUPLICATE   # kept once
    assert (inbox.offer("a-ps", push(1)).kind, inbox.offer("a-ps", push(1)).reason) == (LATE, "late")
    got = inbox.offer("a-ps", push(2))
    assert got.kind == ACCEPTED and got.item[1] == push(2)   # (the payload, the bytes a PS forwards)
    assert inbox.offer("a-ps", push(2)).reason == "duplicate"
    assert news.pending() == ["b-ps"]
    assert inbox.offer("b-ps", push(2)).kind == ACCEPTED and news.pending() == []
    # the push of round 3 that came early is taken as soon as round 3 opens
    assert list(collect(inbox, ["a-ps", "b-ps"], 3)) == ["a-ps"] and news.pending() == ["b-ps"]


def test_joins_beats_and_outsiders():
    news, inbox = inbox_of()
    news.joinable = {"b-ps"}
    collect(inbox, ["a-ps"], 4)
    assert not news.admits("evil") and news.admits("b-ps")
    assert inbox.offer("b-ps", encode_join(DIM)).kind == NOTED
    assert inbox.offer("b-ps", push(4)).reason == "unknown_sender"   # not a member yet
    assert inbox.offer("b-ps", push(5)).reason == "unknown_sender"   # nor kept for later
    assert inbox.offer("a-ps", encode_beat(DIM)).kind == NOTED
    assert inbox.offer("a-ps", encode_join(DIM)).kind == NOTED   # a member that started again
    assert news.joins == ["b-ps", "a-ps"] and news.pending() == []   # a-ps will not push this round


def test_a_state_answers_only_a_wait_for_the_model_or_the_restarted_ps():
    news, inbox = inbox_of()
    collect(inbox, ["a-ps"], 3)
    state = encode_state(3, np.ones(DIM, np.float32))
    assert inbox.offer("a-ps", state).reason == "unexpected_state"
    news.restarts = "a-ps"
    assert inbox.offer("a-ps", encode_state(2, np.ones(DIM, np.float32))).kind == REFUSED
    assert inbox.offer("a-ps", state).kind == ACCEPTED and news.pending() == []


def test_end_stops_a_wait_for_a_round_the_run_will_not_make():
    news, inbox = inbox_of()
    collect(inbox, ["global-ps"], 5)
    assert inbox.offer("global-ps", encode_end(DIM, 4)).kind == ENDED
    assert news.end == 4


def test_silence_and_when_to_wake():
    news, inbox = inbox_of()
    news.watch = 1.0
    collect(inbox, ["a-ps", "b-ps"], 1)
    news.heard.update({"a-ps": 11.0, "b-ps": 10.0})
    inbox.offer("a-ps", push(1))
    assert news.wake(deadline=20.0, beat_next=12.5) == 12.5
    assert news.wake(deadline=20.0, beat_next=None) == 13.0   # b-ps: 3 beats after 10.0
    assert not news.silent(12.9) and news.loss_reason == "timeout"
    assert news.silent(13.0) and news.loss_reason == "heartbeat"


def test_mixedsync_takes_the_first_push_of_any_sites_next_round():
    news, inbox = inbox_of()
    expected = {"a-ps": 2, "b-ps": 1}
    inbox.members = set(expected)
    inbox.ask_each(expected)
    assert inbox.offer("a-ps", push(3)).kind == EARLY
    assert inbox.offer("a-ps", push(3)).reason == "duplicate"
    assert inbox.offer("b-ps", push(0)).reason == "late"
    assert inbox.offer("b-ps", push(1)).kind == ACCEPTED
    assert inbox.offer("b-ps", encode_join(DIM)).kind == NOTED   # not joining
    news.joinable = {"b-ps"}
    assert inbox.offer("b-ps", encode_join(DIM)).kind == ACCEPTED
    inbox.ask_each({"a-ps": 3})
    assert inbox.take_kept()[0] == "a-ps" and inbox.take_kept() is None


def test_a_sealed_inbox_refuses_what_the_runs_key_did_not_sign():
    news = geo_inbox(Sealer(b"k" * 32, "c"), "geo/push", DIM)
    news.inbox.members = {"a-ps"}
    news.inbox.ask_round(["a-ps"], 1)
    assert news.inbox.offer("a-ps", push(1)).reason == "unsigned"
    signed = Sealer(b"k" * 32, "a-ps").seal("geo/push", 1, push(1))
    assert news.inbox.offer("a-ps", signed).kind == ACCEPTED
    assert news.inbox.offer("a-ps", signed).reason == "replayed"
