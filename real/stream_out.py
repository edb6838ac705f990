"""The sending ends of real.stream: a ZeroMQ DEALER per destination, paced as DDS's writer.

See ``real.stream``'s docstring for the protocol.  Here: a frame of a message is queued to each of
its destinations once their handshakes are done (``ready``), with zmq's tracker for ``flush``.
The receiver answers each frame it took with ``K`` and the frame's key, and two rules pace the
sender by what is still unacknowledged:

* **The writer history** (``_room``): a destination takes at most the run's writer history
  unacknowledged (DDS's WhcHigh: host.writer_history, 2 MiB unless the mode's ranks all send at
  once), so a send returns, as DDS's write does, once only its last history's worth is on the way.
* **The sender's order** (``_in_order``): a frame to one destination waits while a message of
  more than one frame to another is still unacknowledged, so that a sender's large messages to
  several peers cross its link one after another, as DDS's do and as emu models them.  DDS's
  datagrams wait in the link's deep queue in the order written; TCP keeps a socket's bytes in
  the socket until the link takes them (its small queues), so two connections share a link
  evenly.  geo's PS put its four pulls of a round on four connections at once, and all ended
  late together (14.3 s a round against DDS's 11 s); with the history alone the next pull still
  started 2 MiB before the last ended and shared the uplink for them (12.6 s), and with a frame
  of overlap 12.0 s (notebook entry 42).  Messages of one frame (a pipelined allreduce's pieces,
  round robin to its peers) do not wait for each other: their overlap is a frame at most.

A destination that left (no endpoint in the last ``ready``), or whose acknowledgements stopped
for ``STALL_S``, holds nobody up (its receiver refused the connection, or hangs); neither does a
wait beyond the send's timeout (counted as ``stream_window_timeouts``): the frame is queued
anyway, within zmq's high-water mark.  An acknowledgement only paces its sender, so it needs no
tag.  Once a dealer is ready its socket is used under ``StreamOut._order`` only.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from typing import Optional

import zmq

from dtemu.core.wire import frame_auth
from dtemu.real.stream import FRAME_BYTES, FRAME_HEAD, SNDHWM, valid_endpoint

STALL_S = 10.0    # a destination whose acknowledgements stopped this long holds nobody up


def _of_large(key: bytes) -> int:
    """1 if the frame ``key`` names is one of several of its message (real.stream.frame_key)."""
    return int(len(key) >= FRAME_HEAD.size and FRAME_HEAD.unpack_from(key)[2] > 1)


class _Dealer:
    """One sender's connection to one destination."""

    def __init__(self, node: str, dest: str, endpoint: str, window: int):
        self.endpoint = endpoint
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        # One identity for the socket's life: after a reconnect the ROUTER knows the connection again.
        self.sock.setsockopt(zmq.ROUTING_ID, secrets.token_bytes(16))
        self.sock.setsockopt(zmq.SNDHWM, max(SNDHWM, window // FRAME_BYTES + 2))   # the window binds first
        self.sock.setsockopt(zmq.LINGER, 2000)    # queued frames still go out after close
        self.sock.connect(endpoint)
        self.sock.send_multipart([b"H", node.encode(), dest.encode()])
        self.ready = False
        self.lock = threading.Lock()   # the handshake's; once ready, the socket is StreamOut._order's
        self.last = None          # the tracker of the last frame queued
        self.unacked: OrderedDict[bytes, int] = OrderedDict()   # key -> bytes, in the order queued
        self.owed = 0             # their bytes
        self.large = 0            # how many of them are frames of messages of more than one frame
        self.progress = 0.0       # when its unacknowledged frames last moved (sent into an empty queue, or acked)

    def take_acks(self, now: float) -> int:
        """Read the receiver's acknowledgements; the bytes still unacknowledged.  One connection
        delivers in order, so an acknowledged frame settles every frame queued before it (a frame
        lost on a reconnect is never acknowledged itself); after STALL_S of silence the rest is
        forgotten."""
        while True:
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(parts) == 2 and parts[0] == b"K" and parts[1] in self.unacked:
                while self._settle() != parts[1]:
                    pass
                self.progress = now
        if self.unacked and now - self.progress > STALL_S:
            while self.unacked:
                self._settle()
        return self.owed

    def owe(self, key: bytes, size: int, now: float) -> None:
        """A frame of ``size`` bytes queued under ``key``, to be acknowledged."""
        if not self.unacked:
            self.progress = now
        self.unacked[key] = size
        self.owed += size
        self.large += _of_large(key)

    def _settle(self) -> bytes:
        key, size = self.unacked.popitem(last=False)
        self.owed -= size
        self.large -= _of_large(key)
        return key


class StreamOut:
    """The sending ends: a DEALER per destination, opened on the first frame for it."""

    def __init__(self, node: str, fkey: Optional[bytes], stats: dict, window: int):
        self.node, self._fkey, self._stats = node, fkey, stats
        self.window = window   # bytes a destination may have unacknowledged (the writer history)
        self._dealers: dict[str, _Dealer] = {}
        self._lock = threading.Lock()
        self._order = threading.Lock()   # one frame queued at a time, in the sender's order
        self._live: frozenset[str] = frozenset()   # destinations with an endpoint, as ready() last saw them

    def ready(self, dests: list[str], endpoints: dict[str, str]) -> bool:
        """Whether every destination's connection has finished its handshake (opening the ones
        still missing; those that are not ready yet take this frame inline)."""
        ok = True
        self._live = frozenset(endpoints)
        for d in dests:
            ep = endpoints.get(d)
            if not ep or not valid_endpoint(ep):
                return False
            with self._lock:
                dealer = self._dealers.get(d)
            if dealer is None or dealer.endpoint != ep:
                with self._order, self._lock:   # (a put may be polling the old socket)
                    if dealer is not None:
                        dealer.sock.close(linger=0)
                    dealer = self._dealers[d] = _Dealer(self.node, d, ep, self.window)
            if not dealer.ready:
                with dealer.lock:
                    ok = self._answer(d, dealer) and ok
        return ok

    def _answer(self, dest: str, dealer: _Dealer) -> bool:
        try:
            parts = dealer.sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return False
        if len(parts) != 2 or parts[0] != b"C":
            return False
        if self._fkey is not None:
            dealer.sock.send_multipart([b"A", frame_auth.stream_tag(self._fkey, self.node, dest, parts[1])])
        dealer.ready = True
        return True

    def put(self, dests: list[str], key: bytes, chunk, wait_s: float) -> bool:
        """Queue ``chunk`` under ``key`` (real.stream.frame_key's: it says how many frames the
        message has) to every destination (all ready), each once its window has room; False if
        one of them could not take it within ``wait_s`` (zmq's queue stayed full): then the frame
        goes inline."""
        # zmq keeps the buffer until its thread sent it: immutable bytes go as they are (a frame of a
        # message given as bytes, a sealed frame, joined Buffers), anything else is copied first
        data = chunk if isinstance(getattr(chunk, "obj", chunk), bytes) else bytes(chunk)
        deadline = time.monotonic() + wait_s
        with self._order:
            self._in_order(dests, deadline)
            for d in dests:
                dealer = self._dealers[d]
                self._room(dealer, len(data), deadline)
                if not dealer.sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000), zmq.POLLOUT):
                    self._stats["stream_fallbacks"] += 1
                    return False
                # tracked: flush waits until zmq has handed the last one to the kernel
                dealer.last = dealer.sock.send_multipart([b"D", key, data], zmq.NOBLOCK, copy=False, track=True)
                dealer.owe(key, len(data), time.monotonic())
        self._stats["stream_sent_frames"] += 1
        return True

    def _in_order(self, dests: list[str], deadline: float) -> None:
        """Wait (under ``_order``) until no live destination other than ``dests`` has a frame of
        a message of more than one frame unacknowledged."""
        with self._lock:
            others = [dl for d, dl in self._dealers.items() if d not in dests and d in self._live and dl.ready]
        while others:
            now = time.monotonic()
            for dl in others:
                dl.take_acks(now)
            others = [dl for dl in others if dl.large]
            if not others:
                return
            if now >= deadline:
                self._stats["stream_window_timeouts"] += 1
                return
            poller = zmq.Poller()
            for dl in others:
                poller.register(dl.sock, zmq.POLLIN)
            poller.poll(max(1, int(min(deadline - now, 0.2) * 1000)))

    def _room(self, dealer: _Dealer, size: int, deadline: float) -> None:
        """Wait (under ``_order``) until ``size`` more bytes fit in ``dealer``'s window (or nothing
        of it is unacknowledged: a frame larger than the window goes alone)."""
        while True:
            now = time.monotonic()
            unacked = dealer.take_acks(now)
            if not unacked or unacked + size <= self.window:
                return
            if now >= deadline:
                self._stats["stream_window_timeouts"] += 1
                return
            dealer.sock.poll(max(1, int(min(deadline - now, 0.2) * 1000)), zmq.POLLIN)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued frame left zmq for the kernel (which delivers it even after this
        process is gone); False if some had not within ``timeout_s``.  Before closing: a frame
        still queued when its DEALER closes is lost, and its receiver waits for it in vain."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            dealers = list(self._dealers.values())
        ok = True
        for dealer in dealers:
            if dealer.last is not None:
                try:
                    dealer.last.wait(max(0.0, deadline - time.monotonic()))
                except zmq.NotDone:
                    ok = False
        return ok

    def close(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        with self._lock:
            for dealer in self._dealers.values():
                dealer.sock.close()
            self._dealers.clear()
