"""A live terminal view of a run, fed by the same events that go to events.jsonl.

``DashboardState`` folds events into what is worth showing (pure, testable
without a terminal); ``render`` turns a state into a rich renderable;
``Dashboard`` ties both to a ``rich.live.Live`` and is what a runtime hands to
``RunDir.observe``.  Both runtimes feed it, so nothing here knows whether ``t``
is virtual (emu) or wall-clock (real).
"""

from __future__ import annotations

import threading
import time

from rich.live import Live

from dtemu.host.dashboard_render import event_line, human_bytes, render  # noqa: F401 (importable from here)
from dtemu.host.dashboard_state import *  # noqa: F401,F403 (the states and DashboardState, importable from here)
from dtemu.host.dashboard_state import DashboardState


class Dashboard:
    """A live dashboard; ``observe`` is what the runtime calls for every event."""

    def __init__(self, scenario, title: str, enabled: bool = True):
        self.state = DashboardState.from_scenario(scenario)
        self.title = title
        self.enabled = enabled
        # Live redraws from its own thread while observe runs in the runtime's.
        self._lock = threading.Lock()
        self._live: Live | None = None
        self._started: float | None = None

    def observe(self, event: dict) -> None:
        with self._lock:
            self.state.observe(event)

    def renderable(self):
        elapsed = None if self._started is None else time.monotonic() - self._started
        with self._lock:
            return render(self.state, self.title, elapsed)

    def __enter__(self) -> Dashboard:
        self._started = time.monotonic()
        if self.enabled:
            self._live = Live(get_renderable=self.renderable, refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            live.__exit__(*exc)
