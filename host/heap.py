"""A training process keeps its heap: glibc's malloc neither trims it nor maps a message's buffers apart.

A rank's heap is churned between its training passes by messages of a few MB (a model down, an update
up, their decoding).  glibc's defaults hand such buffers back to the kernel (a chunk over the mmap
threshold is unmapped when freed; the heap's free top is trimmed), so the next pass faults its own
tensors in again.  Measured on the testbed (docs/notebook/ entry 37, geo BiSparse: one gradient pass a
round, 2.4-4.8 MB messages): 6,000-10,000 minor faults a pass, and a round's training 0.59-0.60 s
against 0.47-0.53 s with the heap kept, in alternating runs.  A KVM guest pays more for a fault than
bare metal, and more when its host is busy, so the faults also made the runs less steady.  The
calibration's step loop churns nothing, so it never saw them: emu could not predict them.

So a rank (and each calibration process, to be timed as a rank trains) calls ``keep`` first: mmap
only for chunks over 32 MB, never trim, grow the heap 64 MB at a time.  The cost is memory: a
process holds the most its heap ever held.  The allocator changes no arithmetic: no model moves.
Settings the user gave malloc (its environment variables, or another allocator preloaded) win;
``DTEMU_KEEP_HEAP=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
MMAP_THRESHOLD = 32 << 20   # the most glibc takes on 64-bit (half its HEAP_MAX_SIZE); larger chunks are mapped
TOP_PAD = 64 << 20
NEVER_TRIM = 2 ** 31 - 1    # mallopt takes an int

USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "LD_PRELOAD")
OFF = "DTEMU_KEEP_HEAP"   # =0: leave malloc as it is


def keep(environ=os.environ) -> bool:
    """Keep this process's heap (see the module's text); False where it is left alone: not glibc's
    malloc, the user configured the allocator, or ``DTEMU_KEEP_HEAP=0``."""
    if environ.get(OFF) == "0" or any(environ.get(k) for k in USER_SETTINGS):
        return False
    return _mallopt_all()


def _mallopt_all() -> bool:
    libc = _glibc()
    if libc is None:
        return False
    # (order: the mmap threshold first, as setting it also stops glibc moving it by itself)
    return all(libc.mallopt(p, v) == 1 for p, v in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                                     (M_TRIM_THRESHOLD, NEVER_TRIM), (M_TOP_PAD, TOP_PAD)))


def _glibc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version   # only glibc has it (musl, macOS: another malloc)
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    except (OSError, AttributeError):
        return None
    return libc
