"""A thread's name as the kernel shows it (top -H, /proc/<pid>/task/*/comm), on Linux.

Python's ``threading`` names stay inside Python: every thread of a rank shows as
"python", so a per-thread CPU breakdown (tools/bench_collectives.py) cannot tell
the receive thread from the main one.  Linux keeps 15 bytes of a name.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_PR_SET_NAME = 15
try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


def name_this_thread(name: str) -> None:
    """Give the calling thread ``name`` (its first 15 bytes) in the kernel; nothing where that fails."""
    if _libc is None:
        return
    try:
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except Exception:  # pragma: no cover
        pass
