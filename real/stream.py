"""Large payloads between machines on a TCP stream beside DDS (the ``lan`` profile).

Why: a 64 kB DDS datagram crosses a 1500-byte MTU as 45 IP fragments, each through
the kernel's packet path alone, and that path was about 70% of the ranks' CPU:
between network namespaces DDS's collectives took 2.2-4.5x gloo's time.  gloo's
TCP crosses as 64 kB segments that the kernel offloads (docs/notebook/, entries
20 and 41).  CycloneDDS's TCP transport is not in the wheel.  So, as ``real.shm``
does on one host, DDS keeps discovery, the order, the headers and the seal, and
only a frame's bytes go beside it, here on one ZeroMQ stream (a DEALER to the
peer's ROUTER, over TCP) per (sender, destination):

* Each transport binds a ROUTER on the address it reaches its peers from and says
  where in its presence announcement (``Hello.stream``; in a sealed run under the
  announcement's tag).
* A sender's DEALER opens with ``H`` (its name, the addressee's).  The addressee
  answers ``C`` with a fresh nonce; in a sealed run the sender answers ``A``, the
  nonce's tag under the run's key (``core.wire.frame_auth.stream_tag``), and only
  then does the connection count as that sender's.  Until a DEALER has its ``C``,
  its frames go inline in the DDS samples.
* A frame of ``MIN_BYTES`` or more goes as ``D`` (the frame's header as ``key``,
  its bytes) to each destination first, and then DDS carries the frame with
  ``STREAM_FLAG`` in ``parts`` and, instead of its bytes, their length (and in a
  sealed run a tag over the header and the length, so that a forged reference is
  refused before anyone waits for it).  The receiver (``real.receiving``) takes
  the bytes under (sender, key); a reference whose bytes are not there yet waits,
  and the frames after it from that sender on that topic wait behind it (the
  reassembly needs them in order), until the bytes come or the sender's stream
  has been silent for ``STALL_S`` (not when the sender leaves: its kernel still sends what it
  queued).
* The receiver answers each frame with ``K`` and its key, and the sender is paced by what
  is unacknowledged, as DDS's writer is: a destination takes at most the writer history, and a
  frame to one waits while a message of several frames to another is unacknowledged, so that a
  sender's large messages cross its link one after another (``real.stream_out``).
* The bytes themselves are checked as an inline frame's are: in a sealed run the
  frame's tag is their first bytes.  What is refused is counted: a connection
  that never authenticated (its data is dropped unread beyond its length), a
  message of the wrong shape, bytes beyond a sender's budget (the oldest go).

Not used with the ``loopback`` profile (``real.shm`` is faster there), nor on
durable topics (a late joiner's replay names no bytes of its own).  ``DTEMU_DDS_STREAM=0``
turns it off, ``=1`` on.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict
from typing import Callable, Iterable, Optional

import zmq

from dtemu.core.wire import frame_auth
from dtemu.host import stream_choice
from dtemu.host.thread_name import name_this_thread
from dtemu.real.config import split_peers
from dtemu.real.wire import valid_name

STREAM_FLAG = 1 << 30        # in Frame.parts: the payload is a length, the bytes came on the stream
MIN_BYTES = stream_choice.MIN_BYTES      # smaller frames go inline
FRAME_BYTES = stream_choice.FRAME_BYTES  # a message on the stream is cut into frames of this size
SNDHWM = stream_choice.QUEUE_FRAMES      # frames zmq may queue per destination, at least
STALL_S = 30.0               # a reference waits this long after the sender's stream last delivered,
STALL_MAX_S = 120.0          # and never longer than this (its bytes were lost on a reconnect)
MAX_ASKED = 256              # connections in the middle of their handshake (a flood evicts the oldest)
MAX_CONNECTIONS = 4096       # connections that count as a sender's; beyond, new ones are refused
MAX_KEY_BYTES = 1024         # a frame's header as its key (names of at most 128 characters each)
STORE_BYTES = 256 << 20      # bytes held per sender for references still to come
STORE_TOTAL_BYTES = 1 << 30  # and by all senders together (unsealed, anyone may claim a name)
STORE_AGE_S = 120.0          # bytes nobody asked for this long are dropped
_POLL_MS = 200
STATS = ("stream_sent_frames", "stream_recv_frames", "stream_fallbacks", "stream_refused", "stream_dropped",
         "stream_lost", "stream_errors", "stream_window_timeouts")
_LEN = struct.Struct("<Q")
FRAME_HEAD = struct.Struct("<QIIQ")   # a frame key's numbers: message id, part, parts, total
_ENDPOINT = re.compile(r"^tcp://(\d{1,3}(?:\.\d{1,3}){3}):(\d{1,5})$")


def enabled(profile: str) -> bool:
    """Whether a transport of ``profile`` carries large payloads on the stream (module docstring)."""
    return stream_choice.stream_on(profile)


def frame_key(dds_topic: str, dst: str, label: str, msg_id: int, part: int, parts: int, total: int) -> bytes:
    """What names a frame's bytes on the stream: its whole header (the sender is the connection's)."""
    return FRAME_HEAD.pack(msg_id, part, parts & ~STREAM_FLAG, total) + "\0".join((dds_topic, dst, label)).encode()


def reference(fkey: Optional[bytes], dds_topic: str, src: str, dst: str, label: str, msg_id: int, part: int,
              parts: int, total: int, length: int) -> bytes:
    """The payload DDS carries for a frame whose bytes went on the stream: their length, and in a
    sealed run a tag over the header and the length."""
    body = _LEN.pack(length)
    if fkey is None:
        return body
    return frame_auth.frame_tag(fkey, dds_topic, src, dst, label, msg_id, part, parts, total, b"stream" + body) + body


def read_reference(fkey: Optional[bytes], dds_topic: str, src: str, dst: str, label: str, msg_id: int, part: int,
                   parts: int, total: int, payload) -> Optional[int]:
    """The length a reference names, or None if it is malformed or (sealed) its tag does not verify."""
    view = memoryview(payload)
    if fkey is not None:
        if len(view) != frame_auth.TAG_BYTES + _LEN.size:
            return None
        want = frame_auth.frame_tag(fkey, dds_topic, src, dst, label, msg_id, part, parts, total,
                                    b"stream" + bytes(view[frame_auth.TAG_BYTES:]))
        if not hmac.compare_digest(bytes(view[:frame_auth.TAG_BYTES]), want):
            return None
        view = view[frame_auth.TAG_BYTES:]
    return _LEN.unpack(view)[0] if len(view) == _LEN.size else None


def peer_list(peers) -> list[str]:
    """The peers a transport was given, else ``DTEMU_DDS_PEERS``'s (as the lan profile reads them)."""
    return split_peers(peers) or split_peers(os.environ.get("DTEMU_DDS_PEERS", ""))


def valid_endpoint(endpoint: str) -> bool:
    """An endpoint a Hello may name: tcp://<IPv4 address>:<port>, nothing else (anyone can announce)."""
    m = _ENDPOINT.match(endpoint)
    if not m:
        return False
    try:
        socket.inet_aton(m.group(1))
    except OSError:
        return False
    return 0 < int(m.group(2)) < 65536


def local_address(peers: Iterable[str]) -> str:
    """The address this host reaches its peers from: the interface DDS is told to use
    (``DTEMU_DDS_INTERFACE``, a name or an address), else the source address of a route to
    the first peer that is not this host, else 127.0.0.1."""
    iface = os.environ.get("DTEMU_DDS_INTERFACE", "").strip()
    if iface:
        try:
            socket.inet_aton(iface)
            return iface
        except OSError:
            addr = _interface_address(iface)
            if addr:
                return addr
    for peer in peers:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 7400))   # UDP: no packet leaves, the kernel only picks a route
                addr = s.getsockname()[0]
        except OSError:
            continue
        if addr and not addr.startswith("127."):
            return addr
    return "127.0.0.1"


def _interface_address(name: str) -> Optional[str]:
    import fcntl   # Linux's SIOCGIFADDR
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


class StreamIn:
    """The receiving end: a ROUTER, its thread, and the bytes that wait for their references."""

    def __init__(self, node: str, address: str, fkey: Optional[bytes], max_frame: int, stats: dict,
                 on_bytes: Optional[Callable[[str], None]] = None):
        self.node, self._fkey, self._stats = node, fkey, stats
        self.on_bytes = on_bytes            # told the sender's name when its bytes came
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max(max_frame, FRAME_BYTES) + 4096)   # a bigger one drops its connection
        self._sock.setsockopt(zmq.RCVHWM, 64)
        port = self._sock.bind_to_random_port(f"tcp://{address}")
        self.endpoint = f"tcp://{address}:{port}"
        self._asked: OrderedDict[bytes, tuple[str, bytes]] = OrderedDict()  # identity -> (sender, nonce)
        self._senders: dict[bytes, str] = {}                               # identity -> authenticated sender
        self._lock = threading.Lock()
        self._store: dict[str, OrderedDict] = {}    # sender -> key -> (arrived, bytes)
        self._held: dict[str, int] = {}             # sender -> bytes held
        self._total = 0                             # bytes held, all senders
        self._heard: dict[str, float] = {}          # sender -> when its stream last delivered
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"stream-in-{node}", daemon=True)
        self._thread.start()

    def take(self, sender: str, key: bytes):
        """The bytes ``sender`` sent under ``key`` (a buffer), or None if they are not here (yet)."""
        with self._lock:
            got = self._store.get(sender, {}).pop(key, None)
            if got is None:
                return None
            self._held[sender] -= len(got[1])
            self._total -= len(got[1])
            return got[1]

    def heard(self, sender: str) -> float:
        """When ``sender``'s stream last delivered bytes (monotonic; 0.0: never)."""
        return self._heard.get(sender, 0.0)

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=2.0)
        self._sock.close(linger=0)
        with self._lock:
            self._store.clear()

    def _run(self) -> None:
        name_this_thread("dtemu-stream")
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._closing:
            try:
                if not poller.poll(_POLL_MS):
                    continue
                while True:
                    try:
                        parts = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._on(parts)
            except zmq.ZMQError:
                if self._closing:
                    break
                self._stats["stream_errors"] += 1
            except Exception:   # never die: count and go on
                self._stats["stream_errors"] += 1

    def _on(self, parts) -> None:
        ident, kind = parts[0].bytes, parts[1].bytes if len(parts) > 1 else b""
        if kind == b"D" and len(parts) == 4:
            sender = self._senders.get(ident)
            if sender is None or len(parts[2]) > MAX_KEY_BYTES:
                self._stats["stream_refused"] += 1   # an unauthenticated connection's data, or no header
                return
            self._keep(sender, parts[2].bytes, parts[3].buffer)
            try:   # paces the sender (real.stream_out); at the high-water mark zmq drops it
                self._sock.send_multipart([ident, b"K", parts[2].bytes], zmq.NOBLOCK)
            except zmq.Again:
                pass
        elif kind == b"H" and len(parts) == 4:
            sender, to = _name(parts[2].bytes), _name(parts[3].bytes)   # (None: not a node name)
            if sender is None or to != self.node:
                self._stats["stream_refused"] += 1
                return
            if len(self._senders) >= MAX_CONNECTIONS and ident not in self._senders:
                self._stats["stream_refused"] += 1
                return
            nonce = secrets.token_bytes(16)
            if self._fkey is None:   # unsealed: anyone may claim any name, as on DDS itself
                self._senders[ident] = sender
            else:
                self._asked[ident] = (sender, nonce)
                while len(self._asked) > MAX_ASKED:
                    self._asked.popitem(last=False)
            self._sock.send_multipart([ident, b"C", nonce])
        elif kind == b"A" and len(parts) == 3 and ident in self._asked:
            sender, nonce = self._asked.pop(ident)
            want = frame_auth.stream_tag(self._fkey, sender, self.node, nonce)
            if hmac.compare_digest(parts[2].bytes, want):
                self._senders[ident] = sender
            else:
                self._stats["stream_refused"] += 1
        else:
            self._stats["stream_refused"] += 1

    def _keep(self, sender: str, key: bytes, data) -> None:
        now = time.monotonic()
        with self._lock:
            store = self._store.setdefault(sender, OrderedDict())
            old = store.pop(key, None)
            if old is not None:
                self._held[sender] -= len(old[1])
                self._total -= len(old[1])
            store[key] = (now, data)
            self._held[sender] = self._held.get(sender, 0) + len(data)
            self._total += len(data)
            while store and (self._held[sender] > STORE_BYTES or self._total > STORE_TOTAL_BYTES
                             or now - next(iter(store.values()))[0] > STORE_AGE_S):
                _, (_, gone) = store.popitem(last=False)
                self._held[sender] -= len(gone)
                self._total -= len(gone)
                self._stats["stream_dropped"] += 1
            self._heard[sender] = now
        if self.on_bytes is not None:
            self.on_bytes(sender)


def _name(raw: bytes) -> Optional[str]:
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        return None
    return name if valid_name(name) else None
