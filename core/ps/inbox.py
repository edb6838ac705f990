"""What a synchronous round of the parameter server makes of each worker's message, with no I/O
(as core.fl.inbox does for FL rounds and core.flower.inbox for a Flower app's replies): the round's
version and the workers it expects are its state; offer it a decoded message and it answers what the
message is to the round (a ``Verdict``, core.runtime.verdict, every inbox's).  The server
(core.ps.server) does the sending, counting and logging."""

from __future__ import annotations

from dtemu.core.ps import messages as pm
from dtemu.core.runtime.verdict import ACCEPTED, IGNORED, JOIN, NOT_FINITE, REFUSED, Verdict

class RoundInbox:
    def __init__(self, version: int, expected: set[int]):
        self.version, self.expected = version, expected
        self.updates: dict[int, pm.Update] = {}
        self.failed: set[int] = set()  # workers whose update from this version was not finite

    def offer(self, m) -> Verdict:
        """``m``: a decoded message (None: one the decoder refused already)."""
        if isinstance(m, pm.Join):
            return Verdict(JOIN)
        if not isinstance(m, (pm.Update, pm.NotFinite)):
            return Verdict(IGNORED)
        if m.version != self.version:
            return Verdict(REFUSED, "late" if m.version < self.version else "future",
                           f"version {m.version}, now {self.version}")
        if m.worker not in self.expected:
            return Verdict(REFUSED, "not_selected")
        if m.worker in self.updates or m.worker in self.failed:
            return Verdict(REFUSED, "duplicate")
        if isinstance(m, pm.NotFinite):
            self.failed.add(m.worker)
            return Verdict(NOT_FINITE)
        self.updates[m.worker] = m
        return Verdict(ACCEPTED)

    def open(self, quorum: int) -> bool:
        """Is the round still taking messages: fewer updates than its quorum, and someone expected
        has not answered yet?"""
        return len(self.updates) < quorum and len(self.updates) + len(self.failed) < len(self.expected)
