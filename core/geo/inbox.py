"""What a geo role makes of each payload it receives, with no I/O (as core.fl.inbox and
core.ps.inbox do for FL and ps): offer it a decoded payload and it answers a ``Verdict``
(core.runtime.verdict, every inbox's: ACCEPTED where it is taken for the round).

Its state is the round being collected (its senders and what came), the pushes that came before
their round, when each sender was last heard, and the run's membership news: who said JOIN, who
may, whether a STATE is welcome and where MixedSync's END put the last round.
core.geo.receiver does the receiving, the heartbeats, the counting and the logging.
"""

from __future__ import annotations

from dtemu.core.geo.payload import BEAT, END, JOIN, STATE, Payload
from dtemu.core.runtime.verdict import ACCEPTED, EARLY, ENDED, NOTED, REFUSED, Verdict

SILENT_BEATS = 3   # heartbeats missed before a sender counts as lost


class PayloadInbox:
    def __init__(self, site_of: dict[str, str], site: str):
        self.site_of, self.site = site_of, site
        self.early: dict[tuple[int, str], tuple[Payload, bytes]] = {}
        # Heartbeats (geo.heartbeat_s): ``watch`` = period: a sender silent for SILENT_BEATS periods
        # is given up before the round's deadline.  ``heard``: when each sender was last heard.
        self.watch: float | None = None
        self.heard: dict[str, float] = {}
        self.loss_reason = "timeout"
        # Joining (core.geo.join): ``joinable``: nodes not in a round's senders whose JOIN (or beat)
        # is welcome; ``joins``: who said JOIN after the start (a newcomer, or a member that started
        # again: it is not waited for any more); ``state_ok``: a STATE (the model of a running run)
        # answers a wait for the initial model; ``restarts``: the one sender (a worker's local PS)
        # whose STATE also answers a wait for a round's pull: it started again and was let in anew
        # (the STATE is the model of that round or a later one, never of an earlier one).
        self.joinable: set[str] = set()
        self.joins: list[str] = []
        self.state_ok = False
        self.restarts: str | None = None
        # MixedSync's END (core.geo.payload): the last update the run sent; a wait for a later one
        # ends at once, without it.
        self.end: int | None = None
        # the round being collected: from whom, which, what came (sender -> (payload, raw bytes))
        self.senders: list[str] = []
        self.round = 0
        self.count_wan = True
        self.got: dict[str, tuple[Payload, bytes]] = {}

    def _across(self, src: str) -> bool:
        return self.site_of.get(src) != self.site

    def admits(self, src: str, senders) -> bool:
        """Is ``src`` worth opening: one of ``senders``, or a node that may join?"""
        return src in senders or src in self.joinable

    # --- a round's pushes from known senders (FSA, HFA, a pull) -----------------------------
    def open(self, senders: list[str], round_: int, now: float, count_wan: bool = True) -> bool:
        """Collect ``round_`` from ``senders``; what came early is taken now.  False: the run's
        END says that round will not come (``got`` holds what there is)."""
        self.senders, self.round, self.count_wan = list(senders), round_, count_wan
        self.got = {s: self.early.pop((round_, s)) for s in senders if (round_, s) in self.early}
        if self.end is not None and round_ > self.end:
            return False
        for s in senders:
            self.heard.setdefault(s, now)
        self.loss_reason = "timeout"
        return True

    def pending(self) -> list[str]:
        """The senders still waited for (one that said JOIN will not push this round)."""
        return [s for s in self.senders if s not in self.got and s not in self.joins]

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

    def offer(self, src: str, payload: Payload, raw: bytes, now: float) -> Verdict:
        """A payload from ``src`` (``admits`` said yes) while ``round_`` is collected."""
        outsider = src not in self.senders
        self.heard[src] = now
        kind = payload.kind
        if kind in (BEAT, JOIN) and (outsider or (kind == JOIN and self.round > 0)):
            # a newcomer's hello, or a member that started again (it will not push this round)
            if kind == JOIN and src not in self.joins:
                self.joins.append(src)
            return Verdict(NOTED, wan=self._across(src))
        if outsider:
            return Verdict(REFUSED, "unknown_sender")   # not a member (yet): its pushes are not used
        if kind in (BEAT, END):
            if kind == END:
                self.end = payload.round if self.end is None else min(self.end, payload.round)
                if self.round > self.end:
                    return Verdict(ENDED, wan=self._across(src))
            return Verdict(NOTED, wan=self._across(src))
        if kind == STATE:   # the model of a run already going: for a newcomer, or from a restarted PS
            if self.state_ok or (src == self.restarts and payload.round >= self.round):
                self.got[src] = (payload, raw)
                return Verdict(ACCEPTED)
            return Verdict(REFUSED, "unexpected_state")
        if payload.round < self.round or (payload.round == self.round and src in self.got):
            return Verdict(REFUSED, "stale" if payload.round < self.round else "duplicate")
        wan = self.count_wan and self._across(src)
        if payload.round > self.round:
            self.early[(payload.round, src)] = (payload, raw)
            return Verdict(EARLY, wan=wan)
        self.got[src] = (payload, raw)
        return Verdict(ACCEPTED, wan=wan)

    # --- MixedSync: the first push of any site's expected round -----------------------------
    def take_early(self, expected: dict[str, int]):
        """(sender, payload, raw) of a push of its expected round that came before, or None."""
        for src, round_ in expected.items():
            if (round_, src) in self.early:
                return (src, *self.early.pop((round_, src)))
        return None

    def offer_next(self, src: str, payload: Payload, raw: bytes, expected: dict[str, int]) -> Verdict:
        """A payload from ``src`` (``admits`` said yes) while every site's ``expected`` round is
        awaited.  ACCEPTED: the caller goes on with it (a push of its round, or a JOIN when joining)."""
        if payload.kind in (BEAT, JOIN):
            return Verdict(ACCEPTED if payload.kind == JOIN and self.joinable else NOTED, wan=self._across(src))
        if src not in expected:
            return Verdict(REFUSED, "unknown_sender")   # not a member (yet): its pushes are not used
        want = expected[src]
        if payload.round < want or (payload.round, src) in self.early:
            return Verdict(REFUSED, "stale" if payload.round < want else "duplicate")
        if payload.round > want:
            self.early[(payload.round, src)] = (payload, raw)
            return Verdict(EARLY, wan=self._across(src))
        return Verdict(ACCEPTED, wan=self._across(src))
