"""A geo role's receiving: it waits on a topic, opens and decodes each message, asks the role's
inbox (core.runtime.inbox, with geo's notes: core.geo.inbox) what it is, and does what follows: counts the WAN bytes,
refuses and counts what is refused (core.runtime.refusal), and sends the role's heartbeats
while it waits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator

from dtemu.core import events as ev
from dtemu.core.geo.inbox import geo_inbox
from dtemu.core.geo.payload import STATE
from dtemu.core.runtime.collect import FIRST, Quorum, collect
from dtemu.core.runtime.verdict import ACCEPTED, EARLY, ENDED, NOTED, REFUSED, Verdict
from dtemu.core.runtime.refusal import refuse


@dataclass
class Beat:
    """A role's heartbeat: ``send()`` is a generator that sends one; every ``every`` seconds while
    the role waits in a receiver (shared by a role's receivers)."""

    send: Callable[[], Generator]
    every: float
    next: float | None = None


class Receiver:
    def __init__(self, ctx, topic: str, dim: int, site_of: dict[str, str], site: str, result):
        self.ctx, self.result = ctx, result
        self.site_of, self.site = site_of, site
        self.news = geo_inbox(ctx.sealer, topic, dim)   # geo's notes; the inbox is ``news.inbox``
        self.inbox = self.news.inbox
        self.beat: Beat | None = None

    def _refuse(self, msg, reason: str, error: str = "") -> None:
        self.result.rejected += 1   # (geo counts its refusals as one number)
        refuse(self.ctx, None, msg, reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src, reason=reason,
               **({"error": error} if error else {}))

    def _offer(self, msg, count_wan: bool, heard: bool) -> Verdict:
        """The inbox's verdict on ``msg`` (its ``item``, where taken: the payload and the bytes inside
        its envelope, what a PS forwards).  A sender not admitted is refused unopened; whatever is
        refused is counted.  ``heard``: note that its sender was heard (while a round is collected)."""
        if not self.news.admits(msg.src):
            verdict = Verdict(REFUSED, "unknown_sender")
        else:
            got, verdict = self.inbox.read(msg.src, msg.data)
            if verdict is None:
                if heard:
                    self.news.heard[msg.src] = self.ctx.now()
                verdict = self.inbox.take(msg.src, got)
                # The WAN bytes received: what crossed from another site and was used, kept or noted
                # (not the initial model's, ``count_wan`` False, nor a STATE's)
                if self.site_of.get(msg.src) != self.site and (
                        verdict.kind in (NOTED, ENDED)
                        or (verdict.kind in (ACCEPTED, EARLY) and count_wan and got.body[0].kind != STATE)):
                    self.result.wan_received += len(msg.data)
        if verdict.kind not in (ACCEPTED, EARLY, NOTED, ENDED):
            self._refuse(msg, verdict.reason, verdict.error)
        return verdict

    def collect(self, senders: list[str], round_: int, deadline: float | None, count_wan: bool = True):
        """{sender: (payload, raw bytes)} of ``round_``; fewer than ``senders`` when the deadline
        passed, a sender fell silent, or the run's END came first."""
        inbox, news, beat, now = self.inbox, self.news, self.beat, self.ctx.now()
        inbox.members = set(senders)
        got = {s: v.item for s, v in inbox.ask_round(senders, round_).items()}   # what came early
        if news.end is not None and round_ > news.end:   # MixedSync's END: that round will not come
            return got
        for s in senders:
            news.heard.setdefault(s, now)
        news.loss_reason = "timeout"
        if beat is not None and beat.next is None:
            beat.next = now + beat.every

        def act(msg, verdict) -> bool:
            if verdict.kind == ACCEPTED:
                got[msg.src] = verdict.item
            return verdict.kind == ENDED

        def idle():
            """Before a message came: the deadline, a heartbeat to send, a sender fallen silent."""
            now = self.ctx.now()
            if deadline is not None and now >= deadline:
                return True
            if beat is not None and now >= beat.next:
                yield from beat.send()
                beat.next = self.ctx.now() + beat.every
            return news.silent(now)

        yield from collect(inbox, Quorum(None, lambda: bool(news.pending())), deadline, act,
                           wake=lambda: news.wake(deadline, beat.next if beat else None), idle=idle,
                           offer=lambda msg: self._offer(msg, count_wan, heard=True))
        return got

    def collect_next(self, expected: dict[str, int], deadline: float | None):
        """(sender, payload, raw) of the first push of a sender's expected round (MixedSync), or None
        at the deadline; other rounds are kept (later) or refused (earlier), as in ``collect``.  A
        JOIN (from a member, or from a ``joinable`` outsider) is returned at once."""
        inbox = self.inbox
        inbox.members = set(expected)
        inbox.ask_each(expected)
        if (kept := inbox.take_kept()) is not None:
            return (kept[0], *kept[1].item)
        taken = []

        def act(msg, verdict) -> bool:
            if verdict.kind == ACCEPTED:
                taken.append((msg.src, *verdict.item))
            return False

        yield from collect(inbox, FIRST, deadline, act, offer=lambda msg: self._offer(msg, True, heard=False))
        return taken[0] if taken else None
