"""The one inbox: every server's (the FL controller's rounds and FedAsync's versions, a geo PS's pushes and a worker's pulls, a Flower server's replies) is this protocol object with no I/O,
offered one message at a time, in h11's manner.  It answers a ``Verdict`` (core.runtime.verdict).

Its state is the questions out.  Each *slot* (a client, a worker, a sender, a Flower instruction's
id) has at most one question, with a *tag* saying which (a round and its seed, a version, a round)
and a state: WAITING, ANSWERED, CLOSED (its call is over: an answer is late) or LATE_IN (closed, and
its late answer came).  A message goes through three steps:

1. the seal is opened and the bytes read by the mode's ``Reader``: refused as unsigned, forged,
   replayed (core.wire.auth) or malformed;
2. what the reader calls a ``Note`` (a site's JOIN, a heartbeat, MixedSync's END) is
   not an answer: it goes to the mode's own ``note`` hook, the few kinds a mode has beside answers;
3. an ``Answer`` from a member is judged by ``TABLE`` against its slot's question (a slot that was
   not asked: against the round's tag, where the inbox asked a round): its tag is the same, OLDER or
   NEWER, and the question's state gives the verdict and the next state.  An answer to a WAITING
   question is then the mode's to ``check`` (its arrays, its norm, whether it is finite).

A NEWER answer is refused as ``future``, or, where the mode keeps them (geo's pushes of a round not
yet collected), kept for its question and taken when it is asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Protocol

from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, EARLY, LATE, REFUSED, Verdict, opened

# A question's states (NONE: the slot has no question of its own).
NONE, WAITING, ANSWERED, CLOSED, LATE_IN = "none", "waiting", "answered", "closed", "late_in"
# How an answer's tag stands to its question's.
SAME, OLDER, NEWER = "same", "older", "newer"
KEEP, REFUSE = "keep", "refuse"     # what an inbox does with a NEWER answer

# (the question's state, the answer's tag against it) -> (verdict kind, reason, the next state).
# An ACCEPTED here is the mode's ``check`` to confirm; whatever it says, the question is answered.
TABLE: dict[tuple[str, str], tuple[str, str, str]] = {
    (WAITING, SAME): (ACCEPTED, "accepted", ANSWERED),
    (ANSWERED, SAME): (DUPLICATE, "duplicate", ANSWERED),
    (CLOSED, SAME): (LATE, "late", LATE_IN),
    (LATE_IN, SAME): (DUPLICATE, "duplicate", LATE_IN),
    (NONE, SAME): (REFUSED, "not_asked", NONE),
}
for _state in (NONE, WAITING, ANSWERED, CLOSED, LATE_IN):
    TABLE[(_state, OLDER)] = (LATE, "late", _state)          # answers a question no longer asked
    TABLE[(_state, NEWER)] = (REFUSED, "future", _state)     # (or kept: ``newer=KEEP``)


@dataclass(frozen=True)
class Answer:
    """An opened message that answers a question: ``slot``'s question ``tag``."""

    slot: Hashable
    tag: Any
    body: Any                  # what it decoded to (the verdict's ``message``)


@dataclass(frozen=True)
class Note:
    """An opened message that answers no question (a JOIN, a heartbeat, an END)."""

    kind: Any
    body: Any


@dataclass
class Question:
    tag: Any
    state: str = WAITING
    about: Any = None          # what the asker keeps with it (a Flower instruction's Asked)
    sender: str | None = None  # who must answer, where the slot is not a sender (a Flower instruction)


class Reader(Protocol):
    """A mode's part of its inbox: what its bytes are, and whether an answer can be used."""

    def read(self, src: str, sealed) -> Answer | Note:
        """``sealed``: core.wire.auth's Opened.  A DecodeError (an AuthError) for bytes to refuse."""

    def check(self, answer: Answer, question: Question) -> Verdict:
        """ACCEPTED with the ``item`` the role takes, or why the answer cannot be used."""


@dataclass
class Inbox:
    sealer: Any                                  # opens the run's envelope (the identity without a key)
    topic: str
    reader: Reader
    members: Any = None                          # the slots that may answer at all (None: any)
    newer: str = REFUSE                          # KEEP: a NEWER answer waits for its question
    order: Callable[[Any, Any], int] | None = None   # compares tags (None: any other tag is OLDER)
    note: Callable[[str, Note], Verdict] | None = None
    questions: dict = field(default_factory=dict)    # slot -> Question
    current: Any = None                          # the round's tag, for the slots not asked in it
    kept: dict = field(default_factory=dict)     # (tag, slot) -> the Answer: NEWER answers kept

    # --- asking ---------------------------------------------------------------------------------
    def ask(self, slot, tag, about=None, sender: str | None = None) -> None:
        self.questions[slot] = Question(tag, about=about, sender=sender)

    def ask_round(self, slots, tag) -> dict:
        """A round: ``slots`` are asked ``tag``, and nothing else is waited for.  Returns the
        answers kept for it (``newer=KEEP``), taken now: {slot: its verdict}."""
        self.questions = {s: Question(tag) for s in slots}
        self.current = tag
        return {s: v for s in slots if (v := self._take_kept(tag, s)) is not None}

    def ask_each(self, tags: dict) -> None:
        """Each slot its own question (MixedSync: each site's next round); no round's tag."""
        self.questions = {s: Question(t) for s, t in tags.items()}
        self.current = None

    def close(self, slots) -> None:
        """These questions are over: an answer to one now is late."""
        for s in slots:
            q = self.questions.get(s)
            if q is not None and q.state == WAITING:
                q.state = CLOSED

    def answered(self, slot, item=None) -> Verdict:
        """``slot``'s question is answered by what a mode's note brought (a geo STATE)."""
        self.questions[slot].state = ANSWERED
        return Verdict(ACCEPTED, "accepted", item=item)

    # --- what is out -------------------------------------------------------------------------------
    def unanswered(self, slots=None) -> list:
        """The slots (of ``slots``; None: all) whose question has no answer yet (closed or not)."""
        pool = self.questions if slots is None else slots
        return [s for s in pool if (q := self.questions.get(s)) is not None and q.state in (WAITING, CLOSED)]

    def question(self, slot) -> Question | None:
        return self.questions.get(slot)

    def take_kept(self) -> tuple | None:
        """(slot, verdict) of the first answer kept for a question now asked (in the order asked),
        taken; or None."""
        for s, q in self.questions.items():
            if q.state == WAITING and (v := self._take_kept(q.tag, s)) is not None:
                return s, v
        return None

    # --- a message ----------------------------------------------------------------------------------
    def read(self, src: str, data: bytes) -> tuple[Answer | Note | None, Verdict | None]:
        """Step 1 alone: ``(what the bytes are, None)``, or ``(None, the refusal)``."""
        return opened(self.sealer, self.topic, src, data, lambda sealed: self.reader.read(src, sealed))

    def offer(self, src: str, data: bytes) -> Verdict:
        got, refused = self.read(src, data)
        return refused if refused is not None else self.take(src, got)

    def take(self, src: str, got: Answer | Note) -> Verdict:
        """Steps 2 and 3: what a message ``read`` is to the questions out."""
        if isinstance(got, Note):
            if self.note is None:   # (a reader's note that its mode has no hook for)
                return Verdict(REFUSED, "unexpected", f"a {got.kind!r} from {src}", got.body)
            return self.note(src, got)
        return self._judge(src, got)

    def _judge(self, src: str, answer: Answer) -> Verdict:
        if self.members is not None and answer.slot not in self.members:
            return Verdict(REFUSED, "unknown_sender", f"{answer.slot!r} is not one of this run's", answer.body)
        q = self.questions.get(answer.slot)
        if q is not None and q.sender is not None and q.sender != src:
            return Verdict(REFUSED, "wrong_sender", f"{src} answered {q.sender}'s question", answer.body,
                           asked=q.about)
        tag = q.tag if q is not None else self.current
        if q is None and tag is None:
            return Verdict(REFUSED, "not_asked", f"{answer.slot!r} was not asked", answer.body)
        how = self._relation(answer.tag, tag)
        if how == NEWER and self.newer == KEEP:
            if (answer.tag, answer.slot) in self.kept:
                return Verdict(DUPLICATE, "duplicate", message=answer.body)
            self.kept[(answer.tag, answer.slot)] = answer
            return Verdict(EARLY, "early", message=answer.body)
        kind, reason, after = TABLE[(q.state if q is not None else NONE, how)]
        if q is None:
            return Verdict(kind, reason, message=answer.body)
        q.state = after
        if kind != ACCEPTED:
            return Verdict(kind, reason, message=answer.body, asked=q.about)
        return self._checked(answer, q)

    def _checked(self, answer: Answer, q: Question) -> Verdict:
        """The mode's verdict on an answer to its question, with what it answers."""
        v = self.reader.check(answer, q)
        return Verdict(v.kind, v.reason, v.error, answer.body, v.item, q.about)

    def _relation(self, tag, asked) -> str:
        if tag == asked:
            return SAME
        if self.order is None:
            return OLDER
        return OLDER if self.order(tag, asked) < 0 else NEWER

    def _take_kept(self, tag, slot) -> Verdict | None:
        answer = self.kept.pop((tag, slot), None)
        if answer is None:
            return None
        q = self.questions[slot]
        q.state = ANSWERED
        return self._checked(answer, q)
