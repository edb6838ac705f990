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
from dtemu.core.runtime.verdict import ACCEPTED, EARLY, ENDED, NOTED, Verdict
from dtemu.core.runtime.refusal import refuse
from dtemu.core.runtime.requests import Recv


@dataclass
class Beat:
    """A role's heartbeat: ``send()`` is a generator that sends one; every ``every`` seconds while
    the role waits in a receiver (shared by a role's receivers)."""

    send: Callable[[], Generator]
    every: float
    next: float | None = None


class Receiver:
    def __init__(self, ctx, topic: str, dim: int, site_of: dict[str, str], site: str, result):
        self.ctx, self.topic, self.dim, self.result = ctx, topic, dim, result
        self.site_of, self.site = site_of, site
        self.news = geo_inbox(ctx.sealer, topic, dim)   # geo's notes; the inbox is ``news.inbox``
        self.inbox = self.news.inbox
        self.beat: Beat | None = None

    def _refuse(self, msg, reason: str, error: str = "") -> None:
        self.result.rejected += 1   # (geo counts its refusals as one number)
        refuse(self.ctx, None, msg, reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src, reason=reason,
               **({"error": error} if error else {}))

    def _judge(self, msg, count_wan: bool, heard: float | None = None) -> Verdict | None:
        """The inbox's verdict on ``msg`` (its ``item``, where taken: the payload and the bytes inside
        its envelope, what a PS forwards), or None when it was refused before the inbox judged it: not
        from a sender admitted, not authentic under the run's key, or malformed.  ``heard``: the time
        to note that its sender was heard (while a round is collected)."""
        if not self.news.admits(msg.src):
            self._refuse(msg, "unknown_sender")
            return None
        got, refused = self.inbox.read(msg.src, msg.data)
        if refused is not None:
            self._refuse(msg, refused.reason, refused.error)
            return None
        if heard is not None:
            self.news.heard[msg.src] = heard
        verdict = self.inbox.take(msg.src, got)
        payload = got.body[0]
        # The WAN bytes received: what crossed from another site and was used, kept or noted (not
        # the initial model's, ``count_wan`` False, nor a STATE's)
        if self.site_of.get(msg.src) != self.site and (
                verdict.kind in (NOTED, ENDED)
                or (verdict.kind in (ACCEPTED, EARLY) and count_wan and payload.kind != STATE)):
            self.result.wan_received += len(msg.data)
        if verdict.kind not in (ACCEPTED, EARLY, NOTED, ENDED):
            self._refuse(msg, verdict.reason, verdict.error)
        return verdict

    def collect(self, senders: list[str], round_: int, deadline: float | None, count_wan: bool = True):
        """{sender: (payload, raw bytes)} of ``round_``; fewer than ``senders`` when the deadline
        passed, a sender fell silent, or the run's END came first."""
        inbox, news, now = self.inbox, self.news, self.ctx.now()
        inbox.members = set(senders)
        got = {s: v.item for s, v in inbox.ask_round(senders, round_).items()}   # what came early
        if news.end is not None and round_ > news.end:   # MixedSync's END: that round will not come
            return got
        for s in senders:
            news.heard.setdefault(s, now)
        news.loss_reason = "timeout"
        if self.beat is not None and self.beat.next is None:
            self.beat.next = now + self.beat.every
        while news.pending():
            msg = yield Recv((self.topic,), news.wake(deadline, self.beat.next if self.beat else None))
            now = self.ctx.now()
            if msg is None:
                if deadline is not None and now >= deadline:
                    break
                if self.beat is not None and now >= self.beat.next:
                    yield from self.beat.send()
                    self.beat.next = self.ctx.now() + self.beat.every
                if news.silent(now):
                    break
                continue
            verdict = self._judge(msg, count_wan, heard=now)
            if verdict is None:
                continue
            if verdict.kind == ACCEPTED:
                got[msg.src] = verdict.item
            elif verdict.kind == ENDED:
                break
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
        while True:
            msg = yield Recv((self.topic,), deadline)
            if msg is None:
                return None
            verdict = self._judge(msg, count_wan=True)
            if verdict is not None and verdict.kind == ACCEPTED:
                return (msg.src, *verdict.item)
