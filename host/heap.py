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
only for chunks over 32 MB, never trim, grow the heap 64 MB at a time, and one arena for every thread.
The last is for the threads: glibc gives a thread other than the main one an arena of its own, whose
heaps it shrinks and unmaps by rules of their own, and a thread that ends hands its arena to the next.
A Flower ClientApp call runs in a thread of its own (host.flower_thread), and a rank's transport takes
its messages in in a thread of its own.  Measured on the testbed (notebook entry 46, the Flower quickstart, 10 clients):
1 to 6 of each round's 10 calls after the first faulted about 2,000 pages in (8 MB) at 10-18 us a page,
and took twice the CPU and three times the wall of the others, so the round waited for them; with one
arena, none in two runs.  A geo pass in a thread faulted 15,600 pages in its first pass and 2,100 and
950 in the next two; with one arena 8,800-9,000, then none, as on the main thread.  The cost is memory: a
process holds the most its heap ever held.  The allocator changes no arithmetic: no model moves.
Settings the user gave malloc (its environment variables, or another allocator preloaded) win;
``DTEMU_KEEP_HEAP=0`` turns it off.

A kept heap still grows: a fresh rank's first passes put their tensors where no page was touched yet,
and fault them in.  ``pretouch`` faults a rank's headroom in once, before its clock starts (before its
transport and start line, and in the calibration's processes before their first timed step, so both start
alike).  Measured on geo BiSparse's testbed (notebook entry 47): a worker's first pass faulted 15,000-
16,500 pages at 13 us each and its next four up to 4,800 each (0.26-0.33 s of CPU, then up to 0.16,
against 0.08 steady); with the heap touched first, 340 and then none.  What a fault costs here moves
with what this VM's host took back lately (free page reporting), so faults in a timed pass were also
its least predictable part.  The cost is memory: ``PRETOUCH_MB`` a process, fewer where many share a
box; ``DTEMU_PRETOUCH_MB`` sets it (0: none).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
MMAP_THRESHOLD = 32 << 20   # the most glibc takes on 64-bit (half its HEAP_MAX_SIZE); larger chunks are mapped
TOP_PAD = 64 << 20
NEVER_TRIM = 2 ** 31 - 1    # mallopt takes an int
ONE_ARENA = 1   # (its lock is an atomic while one thread allocates at a time, and each thread keeps its tcache)

USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX",
                 "LD_PRELOAD")
MALLOC_TUNABLES = "glibc.malloc."   # (in GLIBC_TUNABLES: the user tuned malloc there)
OFF = "DTEMU_KEEP_HEAP"   # =0: leave malloc as it is
PRETOUCH = "DTEMU_PRETOUCH_MB"   # how much of a kept heap to fault in before the clock starts (0: none)
PRETOUCH_MB = 256   # (geo BiSparse's workers grew theirs 75-90 MB past the start line: notebook entry 47)
MEMORY_SHARE = 0.25   # at most this much of the box's available memory pretouched, all processes together
BLOCK = 8 << 20   # touched in blocks under the mmap threshold, so they come from the heap and stay there
_kept = [False]   # whether keep() set this process's malloc (pretouch is pointless otherwise: trimmed)


def keep(environ=os.environ) -> bool:
    """Keep this process's heap (see the module's text); False where it is left alone: not glibc's
    malloc, the user configured the allocator, or ``DTEMU_KEEP_HEAP=0``."""
    if (environ.get(OFF) == "0" or any(environ.get(k) for k in USER_SETTINGS)
            or MALLOC_TUNABLES in environ.get("GLIBC_TUNABLES", "")):
        return False
    _kept[0] = _mallopt_all()
    return _kept[0]


def pretouch_mb(environ=os.environ, processes: int = 1) -> int:
    """MB of its heap a process faults in before its clock starts: the user's ``DTEMU_PRETOUCH_MB``,
    else ``PRETOUCH_MB``, with ``processes`` on this box together using at most ``MEMORY_SHARE`` of
    its available memory."""
    given = environ.get(PRETOUCH)
    if given is not None and given.strip():
        try:
            return max(0, int(float(given)))
        except ValueError:
            raise ValueError(f"{PRETOUCH}={given!r}: a number of MB was expected (0: touch none)") from None
    return min(PRETOUCH_MB, int(_available_mb() * MEMORY_SHARE / max(1, processes)))


def pretouch(mb: int) -> int:
    """Fault ``mb`` MB of this process's kept heap in and free it back to the heap (not the kernel:
    keep never trims), so the passes that follow find touched pages.  Returns the MB touched: 0 where
    the heap is not kept (glibc would hand it straight back) or ``mb`` is 0."""
    libc = _glibc() if _kept[0] and mb > 0 else None
    if libc is None:
        return 0
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, (ctypes.c_void_p,)
    blocks = [libc.malloc(BLOCK) for _ in range(max(1, mb * (1 << 20) // BLOCK))]
    try:
        for b in blocks:
            if b:
                ctypes.memset(b, 0, BLOCK)
    finally:
        for b in blocks:
            if b:
                libc.free(b)
    return sum(1 for b in blocks if b) * BLOCK >> 20


def _available_mb() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) >> 10
    except OSError:
        pass
    return 0   # not Linux's /proc: touch nothing rather than guess


def _mallopt_all() -> bool:
    libc = _glibc()
    if libc is None:
        return False
    # (order: the mmap threshold first, as setting it also stops glibc moving it by itself)
    return all(libc.mallopt(p, v) == 1 for p, v in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                                     (M_TRIM_THRESHOLD, NEVER_TRIM), (M_TOP_PAD, TOP_PAD),
                                                     (M_ARENA_MAX, ONE_ARENA)))


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
