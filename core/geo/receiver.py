"""A geo role's receiving: it waits on a topic, opens and decodes each message, asks the role's
``PayloadInbox`` (core.geo.inbox) what it is, and does what follows: counts the WAN bytes,
refuses and counts what is refused (core.runtime.refusal), and sends the role's heartbeats
while it waits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator

from dtemu.core import events as ev
from dtemu.core.errors import AuthError, GeoPayloadError
from dtemu.core.geo.inbox import PayloadInbox
from dtemu.core.runtime.verdict import ACCEPTED, ENDED, REFUSED
from dtemu.core.geo.payload import decode
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
        self.inbox = PayloadInbox(site_of, site)
        self.beat: Beat | None = None

    def _refuse(self, msg, reason: str, error: str = "") -> None:
        self.result.rejected += 1   # (geo counts its refusals as one number)
        refuse(self.ctx, None, msg, reason, ev.MESSAGE_REJECTED, topic=msg.topic, src=msg.src, reason=reason,
               **({"error": error} if error else {}))

    def _judge(self, msg, admitted: bool, offer):
        """(the inbox's verdict, the payload, the bytes inside its envelope: what a PS forwards), or
        None when ``msg`` is refused before it: not from a sender admitted, not authentic under the
        run's key, or malformed.  ``offer(payload, raw)``: the inbox's question to ask."""
        if not admitted:
            self._refuse(msg, "unknown_sender")
            return None
        try:
            inner = self.ctx.open(msg)
            payload = decode(inner, self.dim)
        except AuthError as err:
            self._refuse(msg, err.reason, str(err))
            return None
        except GeoPayloadError as err:
            self._refuse(msg, "malformed", str(err))
            return None
        verdict = offer(payload, inner)
        if verdict.wan:
            self.result.wan_received += len(msg.data)
        if verdict.kind == REFUSED:
            self._refuse(msg, verdict.reason)
        return verdict, payload, inner

    def collect(self, senders: list[str], round_: int, deadline: float | None, count_wan: bool = True):
        """{sender: (payload, raw bytes)} of ``round_``; fewer than ``senders`` when the deadline
        passed, a sender fell silent, or the run's END came first."""
        inbox, now = self.inbox, self.ctx.now()
        if not inbox.open(senders, round_, now, count_wan):
            return inbox.got
        if self.beat is not None and self.beat.next is None:
            self.beat.next = now + self.beat.every
        while inbox.pending():
            msg = yield Recv((self.topic,), inbox.wake(deadline, self.beat.next if self.beat else None))
            now = self.ctx.now()
            if msg is None:
                if deadline is not None and now >= deadline:
                    break
                if self.beat is not None and now >= self.beat.next:
                    yield from self.beat.send()
                    self.beat.next = self.ctx.now() + self.beat.every
                if inbox.silent(now):
                    break
                continue
            judged = self._judge(msg, inbox.admits(msg.src, senders),
                                 lambda payload, raw: inbox.offer(msg.src, payload, raw, now))
            if judged is not None and judged[0].kind == ENDED:
                break
        return inbox.got

    def collect_next(self, expected: dict[str, int], deadline: float | None):
        """(sender, payload, raw) of the first push of a sender's expected round (MixedSync), or None
        at the deadline; other rounds are kept (later) or refused (earlier), as in ``collect``.  A
        JOIN (from a member, or from a ``joinable`` outsider) is returned at once."""
        if (early := self.inbox.take_early(expected)) is not None:
            return early
        while True:
            msg = yield Recv((self.topic,), deadline)
            if msg is None:
                return None
            judged = self._judge(msg, self.inbox.admits(msg.src, expected),
                                 lambda payload, raw: self.inbox.offer_next(msg.src, payload, raw, expected))
            if judged is not None and judged[0].kind == ACCEPTED:
                return msg.src, judged[1], judged[2]
