"""How late a rank's timers woke: the testbed's third fidelity monitor (real.monitors).

A role waits on a timer when it sleeps out a staged straggler's time, paces a link, idles, or waits
for a message until a deadline that passes.  On a faithful machine it wakes within a scheduler tick
or a CPU-quota period of the time it asked for; a starved or overloaded one wakes later, and then
every duration the run measured is off by as much.
"""

from __future__ import annotations

KEEP = 100_000  # wakes kept for the percentiles (a run's timers are far fewer; the count stays exact)


class Lateness:
    def __init__(self):
        self.count = 0
        self.worst = 0.0
        self._late: list[float] = []

    def note(self, late_s: float) -> None:
        late = max(0.0, late_s)  # a wake a hair early (clock granularity) is on time
        self.count += 1
        self.worst = max(self.worst, late)
        if len(self._late) < KEEP:
            self._late.append(late)

    def record(self) -> dict:
        """{count, p50_ms, p99_ms, max_ms}, for the rank's summary.json (``real.timers``)."""
        if not self._late:
            return {"count": 0}
        ordered = sorted(self._late)

        def pct(q: float) -> float:
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)

        return {"count": self.count, "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": round(self.worst * 1e3, 3)}
