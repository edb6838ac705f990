"""Same-host payloads through shared memory, beside DDS (the ``loopback`` profile).

Over loopback UDP a 1 MiB frame costs about 1 ms of CPU on the way out (the
copy into CycloneDDS's sample, 16 datagrams through the kernel, flow control)
and as much on the way in (the kernel's copy, the fragments gathered into one
sample, the copy into a Python ``bytes``): docs/notebook/, "Collectives
against gloo".  CycloneDDS moves large samples between processes of one host
through shared memory itself (iceoryx / PSMX), but the cyclonedds-python wheel
used here ships without it.  This module is that path, for the transport:

* A sender keeps one ``Pool`` per (DDS writer, destination node): a file in
  ``/dev/shm`` (mode 0600) of ``slots`` slots of ``SLOT_BYTES`` each, that it
  maps and writes and the destination maps and reads.  A frame's payload is
  copied into a free slot once, and the DDS sample that goes out instead of
  it is a few dozen bytes: the *reference* (``encode_ref``: per destination,
  the file's name, the slot, the length and a random token).  DDS still
  carries every frame, in order, with its header; only the bytes travel beside
  it.
* Each slot has a state word in the file's header: 0 while free, the token
  while it holds a payload.  The sender writes the payload, then the token;
  the receiver (``Slots.resolve``) checks that the slot holds the reference's
  token (nobody who cannot read the file can guess it; a replay finds 0),
  copies the bytes out or lends them as a read-only view, and writes 0 when it
  is done with them.  Slots are freed in any order, so a view a consumer keeps
  holds its own slot and no other.
* A receiver lends views on the topics its transport says (collective frames,
  which are summed or copied into place at once) and only while fewer than
  half of a pool's slots are lent; otherwise, and on every other topic, it
  copies.  A sender that finds no free slot waits a moment for one, then
  sends the frame inline (and, until a slot comes free, does not wait again).

Not used in a sealed run (frames are then authenticated inline, and a forged
reference could consume an honest slot), nor across hosts, nor over shaped
namespaces (the bytes would bypass the shaped links): the transport uses it
with the ``loopback`` profile only, on x86-64 (the state words rely on its
ordered stores), and ``DTEMU_DDS_SHM=0`` turns it off.  Files are unlinked
when their sender closes; a crashed sender's are swept by the next pool
created on the machine (their pid is in the name).
"""

from __future__ import annotations

import mmap
import os
import platform
import re
import secrets
import stat
import struct
import threading
import time
import weakref
from typing import Optional

import numpy as np

from dtemu.core.runtime.requests import Buffers

SHM_DIR = "/dev/shm"
PREFIX = "dtemu-shm-"
_NAME_RE = re.compile(r"^dtemu-shm-(\d+)-(\d+)-([0-9a-f]{16})$")   # uid, pid, random
MAGIC = b"DTEMUSH2"
HEADER = 8192              # magic, slot count and size, names length; the two names; the states
NAMES_AT = 64              # (sender, destination): node names are at most 128 characters
STATES_AT = 4096           # one int64 per slot: 0 free, else the token of what it holds
MAX_SLOTS = (HEADER - STATES_AT) // 8
SLOT_BYTES = 1 << 20       # one frame of the transport's (real.reassembly.FRAME_BYTES)
DEFAULT_SLOTS = 4          # 4 MiB a pool; 8 measured the same (docs/notebook/)
MIN_BYTES = 64 << 10       # smaller payloads go inline: a reference is not worth it
MAX_OPEN = 512             # pools a receiver keeps mapped
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)   # Linux 5.14
SHM_FLAG = 1 << 31         # in Frame.parts: the payload is a reference (real.transport)
_HEAD = struct.Struct("<8sQQQ")   # magic, slots, slot bytes, names length


def enabled(profile: str, sealed: bool) -> bool:
    """Whether a transport of ``profile`` uses pools (see the module docstring)."""
    env = os.environ.get("DTEMU_DDS_SHM", "").strip().lower()
    if env in ("0", "no", "off", "false") or sealed or profile != "loopback":
        return False
    return platform.machine() in ("x86_64", "AMD64") and os.path.isdir(SHM_DIR)


def pool_slots() -> int:
    return min(MAX_SLOTS, max(2, int(os.environ.get("DTEMU_DDS_SHM_SLOTS", DEFAULT_SLOTS))))


def _states(mm: mmap.mmap, slots: int) -> np.ndarray:
    # aligned int64 words, each stored and loaded whole
    return np.frombuffer(mm, np.int64, count=slots, offset=STATES_AT)


def _names_blob(src: str, dst: str) -> bytes:
    s, d = src.encode(), dst.encode()
    return struct.pack("<HH", len(s), len(d)) + s + d


def _token() -> int:
    return secrets.randbits(63) or 1   # positive: a state word is an int64, and 0 means free


class PoolFull(Exception):
    """No slot came free in time: send the frame inline."""


class Pool:
    """The sender's end: a file in /dev/shm of ``slots`` slots."""

    def __init__(self, src: str, dst: str, slots: Optional[int] = None, slot_bytes: int = SLOT_BYTES):
        self.slots = pool_slots() if slots is None else min(MAX_SLOTS, int(slots))
        self.slot_bytes = int(slot_bytes)
        sweep()
        self.name = f"{PREFIX}{os.geteuid()}-{os.getpid()}-{secrets.token_hex(8)}"
        self.path = os.path.join(SHM_DIR, self.name)
        names = _names_blob(src, dst)
        size = HEADER + self.slots * self.slot_bytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._mm[:_HEAD.size] = _HEAD.pack(MAGIC, self.slots, self.slot_bytes, len(names))
        self._mm[NAMES_AT:NAMES_AT + len(names)] = names
        self._prefault()
        self._state = _states(self._mm, self.slots)
        self._next = 0           # slots are tried round the pool from here
        self._full = False       # a wait for a slot ran out: no new wait until one is free

    def _prefault(self) -> None:
        # tmpfs allocates a page on its first write: ~0.8 ms per MiB, four times the copy.  Pay it
        # once here rather than in the first passes over the pool.
        try:
            self._mm.madvise(MADV_POPULATE_WRITE)
        except (OSError, ValueError, AttributeError):   # before Linux 5.14
            zero = bytes(self.slot_bytes)
            for i in range(self.slots):
                off = HEADER + i * self.slot_bytes
                self._mm[off:off + self.slot_bytes] = zero

    def put(self, payload, wait_s: float) -> tuple[int, int, int]:
        """Copy ``payload`` (bytes-like, or ``Buffers`` copied piece by piece) into a free slot;
        (slot, length, token) for the reference.  Raises PoolFull if none came free within
        ``wait_s`` (at once after a wait that ran out, until one is free again)."""
        pieces = payload.parts if isinstance(payload, Buffers) else (payload,)
        n = len(payload)
        if n > self.slot_bytes:
            raise PoolFull(f"{n} bytes do not fit a slot of {self.slot_bytes}")
        slot = self._free_slot(wait_s)
        off = HEADER + slot * self.slot_bytes
        for p in pieces:
            self._mm[off:off + len(p)] = p
            off += len(p)
        token = _token()
        self._state[slot] = token   # after the bytes: the reader trusts the slot once it sees the token
        self._next = (slot + 1) % self.slots
        return slot, n, token

    def _free_slot(self, wait_s: float) -> int:
        deadline, pause = None, 2e-5
        while True:
            for k in range(self.slots):
                slot = (self._next + k) % self.slots
                if self._state[slot] == 0:
                    self._full = False
                    return slot
            if self._full:
                raise PoolFull("the reader still holds every slot")
            now = time.monotonic()
            deadline = now + wait_s if deadline is None else deadline
            if now >= deadline:
                self._full = True
                raise PoolFull(f"no slot came free in {wait_s:.3g} s")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def drained(self) -> bool:
        """Whether the reader is done with every slot."""
        return self._state is None or not self._state.any()

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._state = None
        try:
            self._mm.close()
        except (BufferError, ValueError):  # a view still alive: the mapping goes with the process
            pass


def sweep() -> int:
    """Unlink this user's pool files whose sender process is gone; how many."""
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
_ENTRY_NUMS = struct.Struct("<QQQ")   # slot, length, token


def encode_ref(entries: list[tuple[str, str, int, int, int]]) -> bytes:
    """``entries``: (destination node, pool file name, slot, length, token), one per reader."""
    out = [_REF_HEAD.pack(len(entries))]
    for dst, pool, slot, n, token in entries:
        d, r = dst.encode(), pool.encode()
        out.append(struct.pack("<HH", len(d), len(r)) + d + r + _ENTRY_NUMS.pack(slot, n, token))
    return b"".join(out)


def find_ref(data, node: str) -> Optional[tuple[str, int, int, int]]:
    """This node's (pool, slot, length, token) in a reference; None if it has none.
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
            slot, n, token = _ENTRY_NUMS.unpack_from(mv, pos)
            pos += _ENTRY_NUMS.size
            if d == me:
                return r.decode("ascii"), slot, n, token
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed shared-memory reference: {exc}") from None
    return None


# ---------------------------------------------------------------------------------------------
# The receiver's end

class _Mapped:
    __slots__ = ("mm", "slots", "slot_bytes", "state", "src", "lent", "lock")

    def __init__(self, mm, slots, slot_bytes, src):
        self.mm, self.slots, self.slot_bytes, self.src = mm, slots, slot_bytes, src
        self.state = _states(mm, slots)
        self.lent = 0                  # slots out as views
        self.lock = threading.Lock()   # a view's last reference may go in any thread

    def give_back(self, slot: int) -> None:
        with self.lock:
            self.lent -= 1
            if self.state is not None:
                self.state[slot] = 0


class Slots:
    """The pools a receiver reads from, mapped on first use; ``resolve`` turns a reference into
    the payload and frees its slot.  Called under the transport's drain lock."""

    def __init__(self, node: str):
        self.node = node
        self._open: dict[str, _Mapped] = {}

    def resolve(self, src: str, ref, view: bool = False):
        """The bytes a reference from ``src`` points at; ValueError if it does not hold up.

        ``view``: a read-only uint8 array over the slot instead of a copy, if fewer than half of
        the pool's slots are lent already; the slot is freed when the array and everything made
        from it are gone."""
        found = find_ref(ref, self.node)
        if found is None:
            raise ValueError("a shared-memory reference with no entry for this node")
        name, slot, n, token = found
        pool = self._pool(name, src)
        if slot >= pool.slots or n > pool.slot_bytes or token == 0:
            raise ValueError(f"reference to slot {slot} ({n} bytes) of {name}, out of range")
        if int(pool.state[slot]) != token:
            raise ValueError(f"slot {slot} of {name} does not hold the referenced payload (a replay?)")
        off = HEADER + slot * pool.slot_bytes
        with pool.lock:
            lend = view and 2 * (pool.lent + 1) <= pool.slots
            if lend:
                pool.lent += 1
        if not lend:
            data = pool.mm[off:off + n]
            pool.state[slot] = 0
            return data
        arr = np.frombuffer(pool.mm, np.uint8, count=n, offset=off)
        arr.flags.writeable = False
        weakref.finalize(arr, pool.give_back, slot)
        return arr

    def _pool(self, name: str, src: str) -> _Mapped:
        pool = self._open.get(name)
        if pool is not None:
            if pool.src != src:
                raise ValueError(f"pool {name} is {pool.src!r}'s, not {src!r}'s")
            return pool
        m = _NAME_RE.match(name)
        if not m or int(m.group(1)) != os.geteuid():
            raise ValueError(f"not a pool name of this user: {name!r}")
        if len(self._open) >= MAX_OPEN:
            raise ValueError(f"more than {MAX_OPEN} pools")
        try:
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ValueError(f"cannot open pool {name}: {exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size <= HEADER:
                raise ValueError(f"pool {name} is not this user's regular file")
            mm = mmap.mmap(fd, st.st_size)
        finally:
            os.close(fd)
        magic, slots, slot_bytes, ln = _HEAD.unpack_from(mm, 0)
        if (magic != MAGIC or not 0 < slots <= MAX_SLOTS or HEADER + slots * slot_bytes != st.st_size
                or not 0 < ln <= STATES_AT - NAMES_AT or mm[NAMES_AT:NAMES_AT + ln] != _names_blob(src, self.node)):
            mm.close()
            raise ValueError(f"pool {name} has a bad header, or is not from {src!r} to {self.node!r}")
        pool = self._open[name] = _Mapped(mm, slots, slot_bytes, src)
        return pool

    def close(self) -> None:
        for pool in self._open.values():
            with pool.lock:
                pool.state = None
            try:
                pool.mm.close()
            except (BufferError, ValueError):   # a view still alive: the mapping goes with the process
                pass
        self._open.clear()
