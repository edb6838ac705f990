"""The writer history (CycloneDDS's WhcHigh) real mode runs a scenario with, and its size in bytes.

real.config writes it into the DDS configuration; emu's ``network.send_window_bytes`` models it
(emu.costs, `emu calibrate`), and a testbed run says so (real.on_machines): both runtimes ask here,
so that emu needs nothing of real's.
"""

from __future__ import annotations

import os
import re
from typing import Optional

DEFAULT_WHC_HIGH = "2MiB"
_SIZE_RE = re.compile(r"^\d+(B|KiB|kB|MiB|MB|GiB|GB)?$")
_UNITS = {"B": 1, "": 1, "kB": 1000, "KiB": 1024, "MB": 1000**2, "MiB": 1024**2, "GB": 1000**3, "GiB": 1024**3}


def _whc_high(whc_high: Optional[str] = None) -> str:
    """``whc_high``, else ``$DTEMU_DDS_WHC_HIGH``, else the default; checked."""
    whc = whc_high or os.environ.get("DTEMU_DDS_WHC_HIGH", "").strip() or DEFAULT_WHC_HIGH
    if not _SIZE_RE.match(whc):
        raise ValueError(f"bad WhcHigh size {whc!r}")
    return whc


def whc_high_bytes(whc_high: Optional[str] = None) -> int:
    """The writer history high-water mark real mode runs with, in bytes: what emu's
    ``network.send_window_bytes`` models (dtemu.emu.costs, `emu calibrate`)."""
    whc = _whc_high(whc_high)
    unit = _SIZE_RE.match(whc).group(1) or ""
    return int(whc[: len(whc) - len(unit)]) * _UNITS[unit]


def writer_history(all_to_all: bool, model_params: int) -> str:
    """The writer history (WhcHigh) real mode runs a scenario with: ``DTEMU_DDS_WHC_HIGH`` if
    set, else ``DEFAULT_WHC_HIGH``, except where every rank sends to every other at once
    (``all_to_all``: the mode's, core.modes; data-parallel training), whose writers get a history that holds a whole gradient (fp32, the
    largest message a rank writes): the smallest power of two MiB at or above it.

    Why DDP differs: every rank sends and receives at once.  A writer whose history is
    full waits for its readers' acknowledgements, and those leave on the readers' own
    uplinks, queued behind the readers' gradients: with 2 MiB, half the dense steps of
    the 1.2M CNN stalled 0.2-0.3 s over 100 Mbit/s links (docs/netns.md, "The dense
    stall, tested").  One sender at a time (FL, ESync, geo: a server and its clients)
    keeps 2 MiB: a deeper history there only lets the server queue more behind a slow
    link, which its clients then NACK as missing and it sends again."""
    env = os.environ.get("DTEMU_DDS_WHC_HIGH", "").strip()
    if env:
        return env
    if not all_to_all:
        return DEFAULT_WHC_HIGH
    need = 4 * max(int(model_params), 0)
    mib = 2
    while mib * 1024**2 < need:
        mib *= 2
    return f"{mib}MiB"
