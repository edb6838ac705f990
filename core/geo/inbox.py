"""What a geo role's inbox (core.runtime.inbox, every server's) needs of geo: a push (dense, sparse,
blocks) answers its sender's question for its round; rounds are ordered, and a push of a round not
yet collected is kept for it (``newer=KEEP``).  Beside its rounds geo has a few kinds of its own,
notes that answer no question, and the ``News`` they leave:

- BEAT, a heartbeat: its sender is alive (``heard``);
- JOIN: a site is up: at the start, its answer to round 0; later, it came up late or its PS started
  again (``joins``; it will not push this round);
- END, MixedSync's: the last update the run sent (``end``): a wait for a later round ends at once;
- STATE, the model of a run already going: it answers a wait for the initial model
  (``state_ok``), or a worker's wait for a pull from its PS that started again (``restarts``).

core.geo.receiver does the receiving, the heartbeats, the counting and the logging.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtemu.core.geo.payload import BEAT, END, JOIN, STATE, decode
from dtemu.core.runtime.inbox import KEEP, Answer, Inbox, Note
from dtemu.core.runtime.verdict import ACCEPTED, ENDED, NOTED, REFUSED, Verdict

SILENT_BEATS = 3   # heartbeats missed before a sender counts as lost
NOTES = (BEAT, JOIN, END, STATE)


class PayloadReader:
    def __init__(self, dim: int):
        self.dim = dim

    def read(self, src: str, sealed) -> Answer | Note:
        """(the payload, the bytes inside its envelope: what a PS forwards)."""
        payload = decode(sealed.data, self.dim)
        body = (payload, sealed.data)
        return Note(payload.kind, body) if payload.kind in NOTES else Answer(src, payload.round, body)

    def check(self, answer: Answer, question) -> Verdict:
        return Verdict(ACCEPTED, item=answer.body)


@dataclass
class News:
    """geo's notes, as they came: who is alive, who said JOIN, who may, and where the run ends; the
    ``inbox`` whose note hook it is (``geo_inbox``)."""

    inbox: Inbox
    # Heartbeats (geo.heartbeat_s): ``watch`` = period: a sender silent for SILENT_BEATS periods is
    # given up before the round's deadline.  ``heard``: when each sender was last heard.
    watch: float | None = None
    heard: dict = field(default_factory=dict)
    loss_reason: str = "timeout"
    # Joining (core.geo.join): ``joinable``: nodes outside a round's senders whose JOIN (or beat) is
    # welcome; ``joins``: who said JOIN after the start (a newcomer, or a member that started again:
    # it is not waited for any more); ``state_ok``: a STATE answers a wait for the initial model;
    # ``restarts``: the one sender (a worker's local PS) whose STATE also answers a wait for a round's
    # pull: it started again and was let in anew (the STATE is of that round or a later one).
    joinable: set = field(default_factory=set)
    joins: list = field(default_factory=list)
    state_ok: bool = False
    restarts: str | None = None
    end: int | None = None      # MixedSync's END: the last update the run sent

    def note(self, src: str, note: Note) -> Verdict:
        news, inbox, kind, (payload, _) = self, self.inbox, note.kind, note.body
        outsider = src not in inbox.members
        if inbox.current is None:   # MixedSync's wait: each site's next round (``ask_each``)
            if kind == JOIN and news.joinable:
                return Verdict(ACCEPTED, item=note.body)    # the caller lets it in
            if kind in (BEAT, JOIN):
                return Verdict(NOTED)
            return Verdict(REFUSED, "unknown_sender" if outsider else "unexpected_" + ("state" if kind == STATE else "end"))
        if kind in (BEAT, JOIN) and (outsider or (kind == JOIN and inbox.current > 0)):
            # a newcomer's hello, or a member that started again (it will not push this round)
            if kind == JOIN and src not in news.joins:
                news.joins.append(src)
            return Verdict(NOTED)
        if outsider:
            return Verdict(REFUSED, "unknown_sender")   # not a member (yet)
        if kind == JOIN:   # a member's at the start (round 0): its answer, that it is up
            return inbox.take(src, Answer(src, payload.round, note.body))
        if kind == BEAT:
            return Verdict(NOTED)
        if kind == END:
            news.end = payload.round if news.end is None else min(news.end, payload.round)
            return Verdict(ENDED if inbox.current > news.end else NOTED)
        if news.state_ok or (src == news.restarts and payload.round >= inbox.current):   # a STATE
            return inbox.answered(src, note.body)
        return Verdict(REFUSED, "unexpected_state")

    def admits(self, src: str) -> bool:
        """Is ``src`` worth opening: one of the senders asked, or a node that may join?"""
        return src in self.inbox.members or src in self.joinable

    # --- heartbeats -----------------------------------------------------------------------------------
    def wake(self, deadline: float | None, beat_next: float | None) -> float | None:
        """When to look up from the inbox: the deadline, the next beat to send, the next silence."""
        times = [deadline] if deadline is not None else []
        if beat_next is not None:
            times.append(beat_next)
        if self.watch is not None:
            times += [self.heard[s] + SILENT_BEATS * self.watch for s in self.pending()]
        return min(times) if times else None

    def silent(self, now: float) -> bool:
        """Has a sender still waited for missed SILENT_BEATS heartbeats?"""
        if self.watch is None or not any(now >= self.heard[s] + SILENT_BEATS * self.watch for s in self.pending()):
            return False
        self.loss_reason = "heartbeat"
        return True

    def pending(self) -> list[str]:
        """The senders still waited for (one that said JOIN will not push this round)."""
        return [s for s in self.inbox.unanswered() if s not in self.joins]


def geo_inbox(sealer, topic: str, dim: int) -> News:
    """A geo role's inbox on ``topic`` (``news.inbox``), with geo's notes as its hook."""
    inbox = Inbox(sealer, topic, PayloadReader(dim), members=set(), newer=KEEP, order=lambda a, b: a - b)
    news = News(inbox)
    inbox.note = news.note
    return news
