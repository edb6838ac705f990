"""Events of untrusted origin are rate-limited, so that no input can grow the event log without end.

Anyone on a DDS domain can send a node thousands of messages; each would be
logged (``deliver``, then why it was refused).  ``EventLimiter`` lets at most
``kind.limit`` events of one kind from one origin (its ``src`` or ``client``)
through per ``window_s`` of the runtime's clock (virtual in emu, so this is
deterministic); the rest are counted and reported as one ``events_suppressed``
event when that key's next window opens, or when the node's role ends.  An
honest sender stays far below every budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Window:
    start: float
    count: int = 0
    suppressed: int = 0


class EventLimiter:
    def __init__(self, window_s: float = 1.0, max_keys: int = 4096):
        self.window_s = window_s
        self.max_keys = max_keys  # made-up origins cannot grow it without end either
        self._windows: dict[tuple[str, str], _Window] = {}

    def admit(self, kind: str, origin: str, limit: int, now: float) -> tuple[bool, int]:
        """(log this event?, how many of this key were held back in its last window, to report now)."""
        key = (kind, origin)
        w = self._windows.get(key)
        report = 0
        if w is None or now - w.start >= self.window_s:
            report = w.suppressed if w is not None else 0
            if w is None and len(self._windows) >= self.max_keys:
                self._windows.pop(next(iter(self._windows)))
            w = self._windows[key] = _Window(now)
        if w.count < limit:
            w.count += 1
            return True, report
        w.suppressed += 1
        return False, report

    def drain(self) -> list[tuple[str, str, int]]:
        """(kind, origin, suppressed) of every window that still holds events back."""
        out = [(k, o, w.suppressed) for (k, o), w in self._windows.items() if w.suppressed]
        for w in self._windows.values():
            w.suppressed = 0
        return out
