"""The one collect loop (core.runtime.collect), driven by hand: each quorum policy ends where it
should, ``act`` may send and may stop it, and ``wake``/``idle`` run between messages."""

from __future__ import annotations

from dtemu.core.runtime.collect import FIRST, Quorum, always, collect
from dtemu.core.runtime.inbox import Answer, Inbox
from dtemu.core.runtime.requests import Message, Recv, Send
from dtemu.core.runtime.verdict import ACCEPTED, REFUSED, Verdict
from dtemu.core.wire.auth import Sealer


class Reader:
    """``b"1"`` answers its sender's question 1; ``b"1x"`` too, but cannot be used."""

    def read(self, src, sealed):
        return Answer(src, int(sealed.data.rstrip(b"x")), sealed.data)

    def check(self, answer, question):
        return Verdict(REFUSED, "rejected") if answer.body.endswith(b"x") else Verdict(ACCEPTED, item=answer.tag)


def drive(gen, messages):
    """Answer each Recv with the next message (None once they are out); returns (what the loop
    returned, the requests it made)."""
    requests, messages = [], list(messages)
    try:
        req = next(gen)
        while True:
            requests.append(req)
            req = gen.send((messages.pop(0) if messages else None) if isinstance(req, Recv) else None)
    except StopIteration as stop:
        return stop.value, requests


def msg(src, tag):
    return Message("t", src, str(tag).encode())


def asked(*slots):
    box = Inbox(Sealer(None, "s"), "t", Reader())
    box.ask_round(slots, 1)
    return box


def noted(seen):
    return lambda m, v: seen.append((m.src, v.kind)) and False


def test_all_of_ends_when_no_question_waits():
    seen = []
    how, reqs = drive(collect(asked("a", "b"), Quorum(), 9.0, noted(seen)), [msg("a", 1), msg("a", 1), msg("b", "1x")])
    assert how == "quorum" and [k for _, k in seen] == ["accepted", "duplicate", "refused"]
    assert all(r == Recv(("t",), 9.0) for r in reqs)


def test_k_of_and_first():
    how, _ = drive(collect(asked("a", "b", "c"), Quorum(2), None, lambda m, v: False), [msg("a", 1), msg("c", 1)])
    assert how == "quorum"
    seen = []
    how, _ = drive(collect(asked("a", "b"), FIRST, None, noted(seen)), [msg("x", 1), msg("b", 1), msg("a", 1)])
    assert how == "quorum" and seen == [("x", "refused"), ("b", "accepted")]


def test_a_quorum_that_waits_out_its_deadline_and_the_deadline():
    """FL's round: its quorum, even when every client asked has answered (one refused)."""
    how, reqs = drive(collect(asked("a", "b"), Quorum(2, always), 5.0, lambda m, v: False), [msg("a", 1), msg("b", "1x")])
    assert how == "deadline" and len(reqs) == 3


def test_act_may_send_and_stop():
    def act(m, v):
        yield Send("out", b"model", to=m.src)
        return m.src == "b"

    how, reqs = drive(collect(asked("a", "b", "c"), Quorum(), None, act), [msg("a", 1), msg("b", 1)])
    assert how == "stopped" and [r.to for r in reqs if isinstance(r, Send)] == ["a", "b"]


def test_idle_runs_between_messages_at_the_times_wake_gives():
    beats = []

    def idle():
        beats.append(len(beats))
        yield Send("beat", b"", to=None)
        return len(beats) == 2

    how, reqs = drive(collect(asked("a"), Quorum(), 10.0, lambda m, v: False, wake=lambda: 1.0 + len(beats), idle=idle),
                      [])
    assert how == "deadline" and beats == [0, 1]
    assert [r.deadline for r in reqs if isinstance(r, Recv)] == [1.0, 2.0]
