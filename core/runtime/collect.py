"""The one collect loop: how every server waits for its answers (FL's rounds and FedAsync's next
update, ps's rounds and its asynchronous updates, a geo role's round, MixedSync's next push, a
Flower grid call).  It receives on the inbox's topic, offers each message to the inbox
(core.runtime.inbox) and hands the verdict to the role's ``act``, until the quorum is met or the
deadline passes.  The quorum is a ``Quorum``:

| policy | ends when |
|---|---|
| all of (``need=None``) | no question waits for its answer |
| k of (``need=k``) | k answers are accepted, or no question waits |
| first (``need=1``) | one answer is accepted: the asynchronous rules' one at a time, MixedSync's next push |
| deadline | always, at ``deadline`` (None: never) |

``act(msg, verdict)`` is the role's part: it counts, logs and keeps what it takes; it returns True
to end the collection early (a Flower pull's first reply, geo's END, a diverged model).  An ``act``
that sends is a generator, and returns the same at its end.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from dtemu.core.runtime.requests import Recv
from dtemu.core.runtime.verdict import ACCEPTED


@dataclass(frozen=True)
class Quorum:
    need: int | None = None     # accepted answers that end it (None: every question answered)
    # A collection ends when no question waits, unless the role says otherwise: FL's round waits out
    # its deadline for its quorum even when every client asked has answered (some refused).
    waiting: Callable[[], bool] | None = None


def always() -> bool:
    return True


FIRST = Quorum(1, always)      # the first answer accepted, whatever else waits
UNTIL_DEADLINE = Quorum(None, always)   # every message until the deadline (or ``act`` stops it)


def collect(inbox, quorum: Quorum, deadline: float | None, act, wake=None, idle=None, offer=None):
    """Collect until ``quorum`` is met, ``act`` says stop, or ``deadline``; returns how it ended:
    "quorum", "stopped" or "deadline".  ``wake()``: when to look up before a message comes (geo's
    heartbeats; default: the deadline); ``idle()``: what the role does then (a generator: it may
    send), True to stop.  ``offer(msg)``: a role's own way to the inbox's verdict (geo's receiver
    notes who it heard from and counts the WAN's bytes); default ``inbox.offer``."""
    accepted = 0
    waiting = quorum.waiting or (lambda: bool(inbox.unanswered()))
    while (quorum.need is None or accepted < quorum.need) and waiting():
        msg = yield Recv((inbox.topic,), deadline if wake is None else wake())
        if msg is None:
            if idle is None or (yield from idle()):
                return "deadline"
            continue
        verdict = inbox.offer(msg.src, msg.data) if offer is None else offer(msg)
        accepted += verdict.kind == ACCEPTED
        stop = act(msg, verdict)
        if inspect.isgenerator(stop):
            stop = yield from stop
        if stop:
            return "stopped"
    return "quorum"
