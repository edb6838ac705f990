"""Same-host payloads through shared memory, beside DDS (the ``loopback`` profile).

Over loopback UDP a 1 MiB frame costs about 1 ms of CPU on the way out (the
copy into CycloneDDS's sample, 16 datagrams through the kernel, flow control)
and as much on the way in (the kernel's copy, the fragments gathered into one
sample, the copy into a Python ``bytes``): docs/results.md, "Collectives
against gloo".  CycloneDDS moves large samples between processes of one host
through shared memory itself (iceoryx / PSMX), but the cyclonedds-python wheel
used here ships without it.  This module is that path, for the transport:

* A sender keeps one ``Ring`` per (DDS writer, destination node): a file in
  ``/dev/shm`` (mode 0600) that it maps and writes, and that the destination
  maps and reads.  A frame's payload is copied into the ring once, and the DDS
  sample that goes out instead of it is a few dozen bytes: the *reference*
  (``encode_ref``: per destination, the ring's file name, position, length
  and a random token).  DDS still carries every frame, in order, with its
  header; only the bytes travel beside it.
* The receiver resolves a reference as it takes the sample (``Rings.resolve``):
  it maps the ring once, checks the slot (the token the sender wrote there
  must be the reference's; nobody who cannot read the file can guess it), copies the bytes
  out (one copy) and releases the slot by advancing the ring's read position.
  Then the frame goes through the same checks and reassembly as one that
  came inline.
* One writer's samples reach a reader in the order written, so each ring is
  single-producer, single-consumer and released in order: a reference behind
  the read position (a replay) is refused.  A sender whose ring is full waits
  for the reader (a bounded wait) and then sends the frame inline instead.

Not used in a sealed run (frames are then authenticated inline, and a forged
reference could consume an honest slot), nor across hosts, nor over shaped
namespaces (the bytes would bypass the shaped links): the transport uses it
with the ``loopback`` profile only, on x86-64 (the ring's position words rely
on its ordered 8-byte stores), and ``DTEMU_DDS_SHM=0`` turns it off.
Files are unlinked when their sender closes; a crashed sender's are swept by
the next ring created on the machine (their pid is in the name).
"""

from __future__ import annotations

import mmap
import os
import platform
import re
import secrets
import stat
import struct
import time
from typing import Optional

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "dtemu-shm-"
_NAME_RE = re.compile(r"^dtemu-shm-(\d+)-(\d+)-([0-9a-f]{16})$")   # uid, pid, random
MAGIC = b"DTEMUSH1"
HEADER = 4096              # magic, capacity, names length; the read position; the two names
READ_AT = 64               # its own cache line: the reader writes it, the sender reads it
NAMES_AT = 128             # (sender, destination): node names are at most 128 characters
SLOT_HEAD = struct.Struct("<QQ")   # token, length
ALIGN = 64
MIN_BYTES = 64 << 10       # smaller payloads go inline: a reference is not worth it
DEFAULT_RING_MB = 8        # two frames of up to 4 MiB in flight per pair (DDS keeps 2 MiB per writer)
MAX_OPEN = 512             # rings a receiver keeps mapped
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)   # Linux 5.14
SHM_FLAG = 1 << 31         # in Frame.parts: the payload is a reference (real.transport)


def enabled(profile: str, sealed: bool) -> bool:
    """Whether a transport of ``profile`` uses rings (see the module docstring)."""
    env = os.environ.get("DTEMU_DDS_SHM", "").strip().lower()
    if env in ("0", "no", "off", "false") or sealed or profile != "loopback":
        return False
    return platform.machine() in ("x86_64", "AMD64") and os.path.isdir(SHM_DIR)


def ring_bytes() -> int:
    return max(1, int(os.environ.get("DTEMU_DDS_SHM_MB", DEFAULT_RING_MB))) << 20


def _slot_size(n: int) -> int:
    return -(-(SLOT_HEAD.size + n) // ALIGN) * ALIGN


def _pos_words(mm: mmap.mmap) -> np.ndarray:
    # [read position]: an aligned int64 the reader stores and the sender loads whole
    return np.frombuffer(mm, np.int64, count=1, offset=READ_AT)


def _names_blob(src: str, dst: str) -> bytes:
    s, d = src.encode(), dst.encode()
    return struct.pack("<HH", len(s), len(d)) + s + d


class RingFull(Exception):
    """The reader did not free room in time: send the frame inline."""


class Ring:
    """The sender's end: a file in /dev/shm, written slot after slot."""

    def __init__(self, src: str, dst: str, capacity: Optional[int] = None):
        self.capacity = ring_bytes() if capacity is None else int(capacity)
        sweep()
        self.name = f"{PREFIX}{os.geteuid()}-{os.getpid()}-{secrets.token_hex(8)}"
        self.path = os.path.join(SHM_DIR, self.name)
        names = _names_blob(src, dst)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, HEADER + self.capacity)
            self._mm = mmap.mmap(fd, HEADER + self.capacity)
        finally:
            os.close(fd)
        self._mm[:24] = MAGIC + struct.pack("<QQ", self.capacity, len(names))
        self._mm[NAMES_AT:NAMES_AT + len(names)] = names
        self._prefault()
        self._read = _pos_words(self._mm)
        self._write = 0    # where the next slot goes (a position counts bytes ever reserved)
        self._referenced = 0   # the end of the last slot a sent reference names

    def _prefault(self) -> None:
        # tmpfs allocates a page on its first write: ~0.8 ms per MiB, four times the copy.  Pay it
        # once here rather than in the first passes over the ring.
        try:
            self._mm.madvise(MADV_POPULATE_WRITE)
        except (OSError, ValueError, AttributeError):   # before Linux 5.14
            zero = bytes(1 << 20)
            for off in range(HEADER, HEADER + self.capacity, len(zero)):
                end = min(off + len(zero), HEADER + self.capacity)
                self._mm[off:end] = zero[:end - off]

    def put(self, payload, wait_s: float) -> tuple[int, int, int]:
        """Copy ``payload`` into the next slot; (position, length, token) for the reference.
        Raises RingFull if the reader has not freed the room within ``wait_s``."""
        n = len(payload)
        need = _slot_size(n)
        if need > self.capacity:
            raise RingFull(f"{n} bytes do not fit a ring of {self.capacity}")
        pos = self._write
        off = pos % self.capacity
        if off + need > self.capacity:   # a slot never wraps: skip to the start
            pos += self.capacity - off
            off = 0
        self._wait_room(pos + need, wait_s)
        token = secrets.randbits(64)
        base = HEADER + off
        self._mm[base + SLOT_HEAD.size:base + SLOT_HEAD.size + n] = payload
        SLOT_HEAD.pack_into(self._mm, base, token, n)
        self._write = pos + need
        return pos, n, token

    def referenced(self) -> None:
        """The reference to the last slot is on its way (a slot written for a frame that went
        inline after all is freed with the next one the reader resolves)."""
        self._referenced = self._write

    def drained(self) -> bool:
        """Whether the reader has taken every referenced slot."""
        return self._read is None or int(self._read[0]) >= self._referenced

    def _wait_room(self, end: int, wait_s: float) -> None:
        if end - int(self._read[0]) <= self.capacity:
            return
        deadline = time.monotonic() + wait_s
        pause = 2e-5
        while end - int(self._read[0]) > self.capacity:
            if time.monotonic() >= deadline:
                raise RingFull(f"the reader has not freed room for {wait_s:.3g} s")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        try:
            self._read = None
            self._mm.close()
        except (BufferError, ValueError):  # a view still alive: the mapping goes with the process
            pass


def sweep() -> int:
    """Unlink this user's ring files whose sender process is gone; how many."""
    gone = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    uid = os.geteuid()
    for name in names:
        m = _NAME_RE.match(name)
        if not m or int(m.group(1)) != uid:
            continue
        pid = int(m.group(2))
        try:
            os.kill(pid, 0)
            continue   # alive (or another user's pid: kept)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            gone += 1
        except OSError:
            pass
    return gone


# ---------------------------------------------------------------------------------------------
# The reference: what travels over DDS in the frame's payload

_REF_HEAD = struct.Struct("<I")
_ENTRY_NUMS = struct.Struct("<QQQ")   # position, length, token


def encode_ref(entries: list[tuple[str, str, int, int, int]]) -> bytes:
    """``entries``: (destination node, ring file name, position, length, token), one per reader."""
    out = [_REF_HEAD.pack(len(entries))]
    for dst, ring, pos, n, token in entries:
        d, r = dst.encode(), ring.encode()
        out.append(struct.pack("<HH", len(d), len(r)) + d + r + _ENTRY_NUMS.pack(pos, n, token))
    return b"".join(out)


def find_ref(data, node: str) -> Optional[tuple[str, int, int, int]]:
    """This node's (ring, position, length, token) in a reference; None if it has none.
    Raises ValueError on a malformed reference."""
    mv = memoryview(data)
    try:
        (count,) = _REF_HEAD.unpack_from(mv, 0)
        pos = _REF_HEAD.size
        me = node.encode()
        for _ in range(min(count, 4096)):
            ld, lr = struct.unpack_from("<HH", mv, pos)
            pos += 4
            d = bytes(mv[pos:pos + ld])
            r = bytes(mv[pos + ld:pos + ld + lr])
            pos += ld + lr
            at, n, token = _ENTRY_NUMS.unpack_from(mv, pos)
            pos += _ENTRY_NUMS.size
            if d == me:
                return r.decode("ascii"), at, n, token
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed shared-memory reference: {exc}") from None
    return None


# ---------------------------------------------------------------------------------------------
# The receiver's end

class _Mapped:
    __slots__ = ("mm", "capacity", "read", "released", "src")

    def __init__(self, mm, capacity, src):
        self.mm, self.capacity, self.src = mm, capacity, src
        self.read = _pos_words(mm)
        self.released = int(self.read[0])


class Rings:
    """The rings a receiver reads from, mapped on first use; ``resolve`` turns a reference
    into the payload bytes (one copy) and frees the slot.  Not thread-safe: the transport
    calls it under its drain lock."""

    def __init__(self, node: str):
        self.node = node
        self._open: dict[str, _Mapped] = {}

    def resolve(self, src: str, ref) -> bytes:
        """The bytes a reference from ``src`` points at (a copy: the slot is free again at once;
        lending it out as a view instead made the sender wait on every consumer that keeps a
        message, e.g. a collective's frames until the payload is whole); ValueError if the
        reference does not hold up."""
        found = find_ref(ref, self.node)
        if found is None:
            raise ValueError("a shared-memory reference with no entry for this node")
        name, pos, n, token = found
        ring = self._ring(name, src)
        off = pos % ring.capacity
        if pos < ring.released:
            raise ValueError(f"reference to position {pos} of {name}, behind the read position {ring.released}")
        if off + _slot_size(n) > ring.capacity:
            raise ValueError(f"reference past the end of {name}")
        base = HEADER + off
        got_token, got_n = SLOT_HEAD.unpack_from(ring.mm, base)
        if got_token != token or got_n != n:
            raise ValueError(f"the slot at {pos} of {name} does not hold the referenced payload")
        data = ring.mm[base + SLOT_HEAD.size:base + SLOT_HEAD.size + n]
        ring.released = pos + _slot_size(n)
        ring.read[0] = ring.released
        return data

    def _ring(self, name: str, src: str) -> _Mapped:
        ring = self._open.get(name)
        if ring is not None:
            if ring.src != src:
                raise ValueError(f"ring {name} is {ring.src!r}'s, not {src!r}'s")
            return ring
        m = _NAME_RE.match(name)
        if not m or int(m.group(1)) != os.geteuid():
            raise ValueError(f"not a ring name of this user: {name!r}")
        if len(self._open) >= MAX_OPEN:
            raise ValueError(f"more than {MAX_OPEN} rings")
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ValueError(f"cannot open ring {name}: {exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size <= HEADER:
                raise ValueError(f"ring {name} is not this user's regular file")
            mm = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        magic, capacity, ln = mm[:8], *struct.unpack_from("<QQ", mm, 8)
        if magic != MAGIC or HEADER + capacity != st.st_size or not 0 < ln <= HEADER - NAMES_AT:
            mm.close()
            raise ValueError(f"ring {name} has a bad header")
        names = mm[NAMES_AT:NAMES_AT + ln]
        if names != _names_blob(src, self.node):
            mm.close()
            raise ValueError(f"ring {name} is not from {src!r} to {self.node!r}")
        ring = self._open[name] = _Mapped(mm, capacity, src)
        return ring

    def close(self) -> None:
        for ring in self._open.values():
            ring.read = None
            try:
                ring.mm.close()
            except (BufferError, ValueError):
                pass
        self._open.clear()
