"""The one inbox (core.runtime.inbox), with a reader of its own: the table's transitions, the
seal, the round's tag for slots not asked, answers kept for later, and the mode's check."""

from __future__ import annotations

import pytest

from dtemu.core.errors import DecodeError
from dtemu.core.runtime.inbox import KEEP, TABLE, Answer, Inbox, Note
from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, EARLY, LATE, NOTED, REFUSED, Verdict
from dtemu.core.wire.auth import Sealer


class Reader:
    """``b"slot tag"`` answers ``slot``'s question ``tag``; ``b"hello"`` is a note; ``b"bad"`` is
    an answer its mode cannot use."""

    def read(self, src, sealed):
        text = sealed.data.decode()
        if text == "hello":
            return Note("hello", src)
        try:
            slot, tag = text.split()
            return Answer(slot, int(tag), text)
        except ValueError:
            raise DecodeError(f"not an answer: {text!r}") from None

    def check(self, answer, question):
        return Verdict(REFUSED, "rejected", "bad") if answer.slot == "bad" else Verdict(ACCEPTED, item=answer.tag)


def inbox(**kw):
    return Inbox(Sealer(None, "server"), "t", Reader(), note=lambda src, n: Verdict(NOTED), **kw)


def test_every_state_answers_every_relation():
    """The table is whole: no answer leaves the inbox without a verdict."""
    states = {s for s, _ in TABLE}
    assert all((s, how) in TABLE for s in states for how in ("same", "older", "newer"))


def test_a_round_its_answers_and_what_is_not_one():
    box = inbox(members={"a", "b", "bad"}, order=lambda x, y: x - y)
    box.ask_round(["a", "b", "bad"], 2)
    assert box.offer("a", b"junk").reason == "malformed" and box.offer("a", b"hello").kind == NOTED
    assert box.offer("a", b"a 2").item == 2 and box.offer("a", b"a 2").kind == DUPLICATE
    assert (box.offer("b", b"b 1").kind, box.offer("b", b"b 3").reason) == (LATE, "future")
    assert box.offer("x", b"x 2").reason == "unknown_sender"
    got = box.offer("bad", b"bad 2")
    assert (got.kind, got.reason, got.message) == (REFUSED, "rejected", "bad 2")
    assert box.unanswered() == ["b"] and box.offer("bad", b"bad 2").kind == DUPLICATE   # it had its one answer
    box.ask_round(["a"], 3)
    assert box.offer("b", b"b 3").reason == "not_asked"    # in the run, not in this round
    assert box.offer("b", b"b 2").kind == LATE             # last round's answer


def test_a_closed_question_takes_one_late_answer():
    """A Flower instruction's: one node may answer it; after its call, once, late."""
    box = inbox()
    box.ask("m1", 0, about="what was asked", sender="n1")
    assert box.offer("n2", b"m1 0").reason == "wrong_sender"
    box.close(["m1"])
    assert box.unanswered(["m1"]) == ["m1"]    # closed without an answer: its call timed out
    late = box.offer("n1", b"m1 0")
    assert (late.kind, late.asked) == (LATE, "what was asked")
    assert box.offer("n1", b"m1 0").kind == DUPLICATE and box.unanswered() == []


def test_newer_answers_are_kept_for_their_question_where_the_mode_keeps_them():
    box = inbox(members={"a", "b"}, newer=KEEP, order=lambda x, y: x - y)
    box.ask_round(["a", "b"], 1)
    assert box.offer("a", b"a 2").kind == EARLY and box.offer("a", b"a 2").kind == DUPLICATE
    taken = box.ask_round(["a", "b"], 2)
    assert list(taken) == ["a"] and taken["a"].item == 2 and box.unanswered() == ["b"]
    box.ask_each({"a": 3, "b": 4})
    box.offer("b", b"b 5")
    assert box.take_kept() is None
    box.ask_each({"b": 5})
    assert box.take_kept()[0] == "b"


@pytest.mark.parametrize("forged", [b"a 1", Sealer(b"x" * 32, "a").seal("t", 1, b"a 1")])
def test_a_sealed_inbox_opens_before_it_reads(forged):
    box = Inbox(Sealer(b"k" * 32, "server"), "t", Reader())
    box.ask_round(["a"], 1)
    assert box.offer("a", forged).reason in ("unsigned", "forged")
    assert box.offer("a", Sealer(b"k" * 32, "a").seal("t", 1, b"a 1")).kind == ACCEPTED
