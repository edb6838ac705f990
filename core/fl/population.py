"""Who is asked in a round: client availability and per-round sampling (pure logic).

Availability (``fl.availability``) says which clients are there at a time:

- ``always``: every client, always (the default; nothing below changes a run).
- ``onoff``: each client alternates online and offline stretches whose lengths
  are exponential with means ``mean_on_s`` / ``mean_off_s``; it starts online with
  the stationary probability ``on / (on + off)``.  Every draw comes from
  ``(seed, client, stretch number)`` alone, so a client's timeline does not
  depend on when or how often it is looked at, nor on the other clients.
- ``trace``: the online windows a trace lists (``parse_trace``; the host reads
  the file and hands the text over).  A client the trace does not name is
  always online.

The controller looks at availability when a round starts (as a server asks the
clients that are checked in); a client that leaves in the middle of a round
is not modelled here (``faults.offline`` crashes a node for that).

Sampling (``fl.sample``): of the available clients, ``fl.asked_per_round``
(fewer if fewer are there) are drawn without replacement from the round's
seed, so a retried round draws anew and the draw does not depend on anything
but the seed and who is available.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

import numpy as np

from dtemu.core.errors import ScenarioError

if TYPE_CHECKING:  # (an annotation only: the scenario imports the modes, which import the roles)
    from dtemu.core.scenario import Scenario

# Bounds of a trace: its text, its windows (it is read whole into memory).
MAX_TRACE_BYTES = 64 << 20
_ONOFF_TAG = 0xA7A1  # keeps the availability draws apart from every other stream of the seed
_SAMPLE_TAG = 0x5A4D


def parse_trace(text: str, clients: list[str], where: str = "trace") -> dict[str, list[tuple[float, float]]]:
    """Online windows by client, from a trace's text.

    One window a line: ``client,start_s,end_s`` (the client by name, ``client7``, or by
    its 1-based index, ``7``); ``end_s`` may be ``inf``.  Blank lines and lines starting
    with ``#`` are skipped; a first line ``client,start_s,end_s`` is a header.  Windows of
    one client may come in any order and may overlap (they are merged)."""
    if len(text) > MAX_TRACE_BYTES:
        raise ScenarioError("fl.availability.trace", f"{where}: more than {MAX_TRACE_BYTES:,} bytes")
    known = set(clients)
    windows: dict[str, list[tuple[float, float]]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if number == 1 and fields == ["client", "start_s", "end_s"]:
            continue
        if len(fields) != 3:
            raise ScenarioError("fl.availability.trace", f"{where}:{number}: expected client,start_s,end_s, "
                                                         f"got {line[:80]!r}")
        name = f"client{fields[0]}" if fields[0].isdigit() else fields[0]
        if name not in known:
            raise ScenarioError("fl.availability.trace", f"{where}:{number}: no client {fields[0][:40]!r} "
                                                         f"(clients are client1..client{len(clients)})")
        try:
            start, end = float(fields[1]), float(fields[2])
        except ValueError:
            raise ScenarioError("fl.availability.trace", f"{where}:{number}: start_s and end_s must be "
                                                         f"numbers, got {line[:80]!r}") from None
        if not (0 <= start < end) or math.isnan(end):
            raise ScenarioError("fl.availability.trace", f"{where}:{number}: expected 0 <= start_s < end_s, "
                                                         f"got {start!r}, {end!r}")
        windows.setdefault(name, []).append((start, end))
    return {name: _merged(ws) for name, ws in windows.items()}


def _merged(windows: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class _Always:
    def online(self, clients: list[str], now: float) -> list[str]:
        return list(clients)


class _Trace:
    def __init__(self, windows: dict[str, list[tuple[float, float]]]):
        self.starts = {c: [w[0] for w in ws] for c, ws in windows.items()}
        self.windows = windows

    def _is_on(self, client: str, now: float) -> bool:
        starts = self.starts.get(client)
        if starts is None:
            return True
        i = bisect.bisect_right(starts, now) - 1
        return i >= 0 and now < self.windows[client][i][1]

    def online(self, clients: list[str], now: float) -> list[str]:
        return [c for c in clients if self._is_on(c, now)]


class _OnOff:
    """Alternating exponential stretches per client; only a client's current stretch is kept."""

    def __init__(self, seed: int, mean_on: float, mean_off: float):
        self.seed, self.mean_on, self.mean_off = seed, mean_on, mean_off
        self.p_on = mean_on / (mean_on + mean_off)
        self.state: dict[int, tuple[int, bool, float]] = {}  # client -> (stretch number, online, ends at)

    def _draw(self, client: int, k: int):
        return np.random.default_rng([self.seed, _ONOFF_TAG, client, k])

    def _is_on(self, client: int, now: float) -> bool:
        k, on, until = self.state.get(client) or self._first(client)
        while until <= now:
            k += 1
            on = not on
            until += self._draw(client, k).exponential(self.mean_on if on else self.mean_off)
        self.state[client] = (k, on, until)
        return on

    def _first(self, client: int) -> tuple[int, bool, float]:
        rng = self._draw(client, 0)
        on = bool(rng.random() < self.p_on)
        # The stretch in progress at time 0: exponential too (memoryless), so the process is stationary.
        return 0, on, rng.exponential(self.mean_on if on else self.mean_off)

    def online(self, clients: list[str], now: float) -> list[str]:
        return [c for c in clients if self._is_on(int(c[len("client"):]), now)]


class Population:
    """Availability and sampling of a scenario's clients.

    ``trace``: the online windows (``parse_trace``) when ``fl.availability.kind`` is
    ``trace``; the host reads the file (``host.traces``)."""

    def __init__(self, scenario: Scenario, trace: dict[str, list[tuple[float, float]]] | None = None):
        fl = scenario.fl
        self.clients = list(scenario.client_names)
        self.asked = fl.asked_per_round
        self.sampled = fl.sampled
        avail = fl.availability
        if avail.kind == "always":
            self.availability = _Always()
        elif avail.kind == "onoff":
            self.availability = _OnOff(scenario.seed, avail.mean_on_s, avail.mean_off_s)
        else:
            if trace is None:
                raise ScenarioError("fl.availability.trace", "the trace was not loaded (the host reads the file "
                                                             "and hands its windows to the controller)")
            self.availability = _Trace(trace)

    def online(self, now: float) -> list[str]:
        """The clients available at ``now``, in rank order."""
        return self.availability.online(self.clients, now)

    def choose(self, now: float, round_seed: int) -> tuple[list[str], int]:
        """(the clients asked this round, in rank order; how many were available)."""
        online = self.online(now)
        if len(online) <= self.asked:
            return online, len(online)
        rng = np.random.default_rng([round_seed, _SAMPLE_TAG])
        picked = np.sort(rng.choice(len(online), size=self.asked, replace=False))
        return [online[i] for i in picked], len(online)
