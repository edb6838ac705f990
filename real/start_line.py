"""The instant a launched run's clock starts: when every rank is up, not when the launcher began.

Ranks take seconds to start (imports, the data set, DDS discovery), longer on a
busy machine, and unevenly.  If their clock counted from the launch, a fault at
``start_s: 5`` could land while a rank is still loading, which emu's time 0
never sees.  So the launcher and its ranks meet at a start line:

1. every rank, once its transport is up and it is about to start its role,
   writes ``ready`` into its folder and waits for the start file;
2. the launcher, once every rank it started is ready (or has ended), writes the
   start file (``start.json``: the Unix time of that instant) atomically;
3. every rank counts its clock from that instant, and so does the launcher's
   schedule of kills and restarts.  A rank started later (a restart) finds the
   file already there.

The role's own barrier (the controller waiting for its clients to match) comes
right after, as it does in emu at time 0.

A rank down from the start (a ``faults.offline`` window from 0 to ``end_s``) is
started with the others all the same, and *held* (``hold_until_window_end``)
before its transport exists: it does its seconds of start-up while it is
"down", no one can reach it, and it comes up at ``end_s`` after the origin, as
emu's node does, rather than ``end_s`` plus its start-up (which on a loaded
machine was 20 s: a site meant to join a geo run came up after the run ended).
The launcher does not wait for a held rank at the start line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

START_FILE = "DTEMU_START_FILE"  # the environment variable that names the start file
HOLD = "DTEMU_HOLD_S"  # a rank down from the start: seconds after the origin it comes up at
READY = "ready"
WAIT_S = 600.0  # a rank gives up on the start line after this (the launcher is gone)


def wait_for_start(rank_folder: Path) -> float | None:
    """Say this rank is ready and return the run's origin (Unix time); None when not launched.

    A launcher that never writes the start file (it died) leaves the rank on its own clock
    after ``WAIT_S``, rather than hanging."""
    path = os.environ.get(START_FILE)
    if not path:
        return None
    (rank_folder / READY).write_text(f"{time.time()!r}\n")
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        origin = read_start(Path(path))
        if origin is not None:
            return origin
        time.sleep(0.02)
    return None


def hold_until_window_end() -> None:
    """A held rank (``HOLD`` set): wait for the origin, then until ``HOLD`` seconds after it.
    Without a start file after ``WAIT_S`` (the launcher is gone), it goes on at once."""
    hold, path = os.environ.get(HOLD), os.environ.get(START_FILE)
    if not hold or not path:
        return
    deadline = time.monotonic() + WAIT_S
    origin = read_start(Path(path))
    while origin is None and time.monotonic() < deadline:
        time.sleep(0.02)
        origin = read_start(Path(path))
    if origin is not None:
        time.sleep(max(0.0, origin + float(hold) - time.time()))


def read_start(path: Path) -> float | None:
    try:
        origin = json.loads(path.read_text())["origin"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(origin) if isinstance(origin, (int, float)) else None


def is_ready(rank_folder: Path) -> bool:
    return (rank_folder / READY).exists()


def write_start(path: Path, origin: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"origin": origin}))
    os.replace(tmp, path)  # atomic: a rank never reads half of it
