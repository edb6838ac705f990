"""The real runtime: drives one role generator over CycloneDDS in wall-clock time.

The same requests as emu (core.runtime), answered for real:

- Send:      ``DdsTransport.send`` (frames of 1 MiB); returns the number of receivers.
- Recv:      ``DdsTransport.recv`` with the time left to the deadline.
- Compute:   runs ``fn()``; a node with ``compute.slowdown`` > 1 then sleeps
             (slowdown - 1) times as long, so a straggler can be staged on one
             machine (jitter too).
- WaitPeers: the subscribe/publish barrier: every peer present (``ctl/hello``)
             and matched as a reader of the topics this node publishes.

Time is ``time.monotonic()`` from the start of the process, so a role's
deadlines are the scenario's timeouts in wall-clock seconds.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

import numpy as np

from core.rundir import RunDir
from core.runtime import Compute, Message, Recv, Send, Sleep, WaitPeers
from core.scenario import ComputeSpec

from .transport import DdsTransport, RejectLimiter


class RealNode:
    """One process's node: the ``Context`` of its role and the driver of its requests."""

    def __init__(self, name: str, transport: DdsTransport, run: RunDir, publishes: Iterable[str],
                 compute: ComputeSpec | None = None, seed: int = 0, epoch: float | None = None):
        self.node = name
        self.transport = transport
        self.run = run
        self.publishes = tuple(publishes)
        self.compute = compute
        self.rng = np.random.default_rng(seed)
        # Event times count from ``epoch`` (wall clock, shared by the ranks of one
        # launch) so that ranks' events line up; deadlines use the monotonic clock.
        start = time.time()
        self.t0 = time.monotonic() - (start - epoch if epoch is not None else 0.0)
        self._readers: dict[str, tuple[int, int]] = {}
        self.bytes_sent = 0
        self.bytes_received = 0
        # Frames the transport drops (malformed, orphan, incomplete) become frame_rejected
        # events, rate-limited per reason so a flood cannot fill the disk.
        transport.on_reject = RejectLimiter(self.emit)

    # --- Context -------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def emit(self, kind: str, **fields: Any) -> None:
        self.run.event({"t": round(self.now(), 6), "node": self.node, "kind": kind, **fields})

    def save_checkpoint(self, data: bytes) -> str:
        return self.run.save_checkpoint(data)

    # --- the driver ----------------------------------------------------
    def drive(self, role) -> Any:
        value, error = None, None
        while True:
            try:
                request = role.throw(error) if error is not None else role.send(value)
            except StopIteration as stop:
                return stop.value
            value, error = None, None
            try:
                value = self._answer(request)
            except Exception as err:  # a failed job or a bad request: the role decides
                error = err

    def _answer(self, req) -> Any:
        if isinstance(req, Send):
            return self._send(req)
        if isinstance(req, Recv):
            return self._recv(req)
        if isinstance(req, Compute):
            return self._compute(req)
        if isinstance(req, Sleep):
            time.sleep(max(0.0, req.seconds))
            return None
        if isinstance(req, WaitPeers):
            return self._wait_peers(req)
        raise TypeError(f"{self.node}: unknown request {req!r}")

    def _send(self, req: Send) -> int:
        self.transport.send(req.topic, req.data, to=req.to)
        receivers = 1 if req.to is not None else self._readers_of(req.topic)
        self.bytes_sent += len(req.data) * receivers
        return receivers

    def _readers_of(self, topic: str) -> int:
        """Peers reading ``topic``; recounted by name only when the match count moves
        (``matched_peers`` costs ~1 ms, too much for every collective frame)."""
        count = self.transport.matched_count(topic)
        cached = self._readers.get(topic)
        if cached is None or cached[0] != count:
            readers = self.transport.matched_peers([topic]).get(topic, {}).get("readers", [])
            cached = self._readers[topic] = (count, len({r for r in readers if r != self.node}))
        return cached[1]

    def _recv(self, req: Recv) -> Message | None:
        timeout = None if req.deadline is None else max(0.0, req.deadline - self.now())
        msg = self.transport.recv(list(req.topics), timeout_s=timeout)
        if msg is None:
            return None
        sent_at = msg.sent_at - self.t0 if msg.sent_at else self.now()
        received_at = msg.received_at - self.t0
        self.bytes_received += len(msg.data)
        self.emit("deliver", src=msg.src, topic=msg.topic, bytes=len(msg.data),
                  sent_at=round(sent_at, 6), comm_s=round(received_at - sent_at, 6))
        return Message(msg.topic, msg.src, msg.data, sent_at=sent_at, received_at=received_at)

    def _compute(self, req: Compute) -> Any:
        start = time.monotonic()
        result = req.fn()
        spec = self.compute
        if req.kind == "train" and spec is not None and (spec.slowdown > 1 or spec.jitter):
            elapsed = time.monotonic() - start
            factor = spec.slowdown * (1 + (self.rng.uniform(-spec.jitter, spec.jitter) if spec.jitter else 0))
            time.sleep(max(0.0, (factor - 1) * elapsed))
        return result

    def _wait_peers(self, req: WaitPeers) -> frozenset:
        def left() -> float:
            return 3600.0 if req.deadline is None else max(0.0, req.deadline - self.now())

        missing = set(self.transport.wait_peers(list(req.peers), timeout_s=left()))
        present = [p for p in req.peers if p not in missing]
        if present and self.publishes:
            unmatched = self.transport.wait_matched({t: present for t in self.publishes},
                                                    timeout_s=left(), role="readers")
            for names in unmatched.values():
                if isinstance(names, (list, tuple, set)):
                    missing.update(names)
        return frozenset(p for p in req.peers if p not in missing)

