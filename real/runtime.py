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

Faults (core.faults decides them, as in emu): a crash at a protocol point
ends the process at once with ``os._exit(CRASH_EXIT + index)`` (mid-upload:
after half of the update's frames; after a send: once it is flushed), so
that ``real launch`` can restart it; message loss, duplicates, reordering,
partitions and dropouts are applied to what this node receives; a corrupt
client damages its updates as it sends them.
"""

from __future__ import annotations

import heapq
import os
import time
from typing import Any, Iterable

import numpy as np

from dtemu.host.rundir import RunDir
from dtemu.core.runtime import faults as faultlib
from dtemu.core.wire.messages import TrainCmd
from dtemu.core.runtime.requests import CLIENT_UPDATE, TRAIN_CMD, Compute, Message, Recv, Send, Sleep, WaitPeers
from dtemu.core.scenario import ComputeSpec, FaultSpec

from dtemu.real.transport import DdsTransport, RejectLimiter


# A process that crashes at faults.crashes[i] exits with CRASH_EXIT + i (i < 100).
CRASH_EXIT = 100


class RealNode:
    """One process's node: the ``Context`` of its role and the driver of its requests."""

    def __init__(self, name: str, transport: DdsTransport, run: RunDir, publishes: Iterable[str],
                 compute: ComputeSpec | None = None, seed: int = 0, epoch: float | None = None,
                 faults: FaultSpec | None = None, fired: Iterable[int] = (), rank: int = 0,
                 scenario_seed: int = 0):
        self.node = name
        # Sealed messages count from here: a restarted process goes on above its previous life.
        self.incarnation = int(time.time() * 1000)
        self.faults = faults or FaultSpec()
        self.scenario_seed = scenario_seed
        self.rank = rank
        self.crash_plan = faultlib.CrashPlan(self.faults, set(fired))
        self.armed: faultlib.Crash | None = None
        self.delivery = (faultlib.DeliveryFaults(self.faults, scenario_seed, stream=rank)
                         if self.faults.perturbs_delivery else None)
        self._held: list[tuple[float, int, Message]] = []  # delayed or duplicated deliveries
        self._held_seq = 0
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
        transport.on_reject = RejectLimiter(self._log)  # called from the receive thread

    # --- Context -------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def _log(self, kind: str, **fields: Any) -> None:
        self.run.event({"t": round(self.now(), 6), "node": self.node, "kind": kind, **fields})

    def emit(self, kind: str, **fields: Any) -> None:
        self._log(kind, **fields)
        crash = self.crash_plan.trigger(self.node, kind, fields)
        if crash is not None:
            self.emit("fault", fault="crash", at=crash.spec.at, round=crash.spec.round)
            if crash.landing == faultlib.NOW:
                self._die(crash, flush=kind == "upload_done")
            self.armed = crash

    def _die(self, crash: faultlib.Crash, flush: bool = False) -> None:
        """The crash: no clean-up, no summary; what was sent may still be flushed."""
        if flush:
            self.transport.flush(timeout_s=5.0)
        self.run.event({"t": round(self.now(), 6), "node": self.node, "kind": "node_down"})
        os._exit(CRASH_EXIT + crash.index)

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
        if self.armed is not None and isinstance(req, (Send, Compute)):
            crash, self.armed = self.armed, None
            if crash.landing == faultlib.IN_COMPUTE:
                req.fn()  # the work is done, and lost with the process
            elif crash.landing == faultlib.IN_SEND:
                frames = -(-len(req.data) // self.transport.frame_bytes)
                self.transport.send(req.topic, req.data, to=req.to, only_frames=max(0, frames // 2))
                self._die(crash, flush=True)
            elif isinstance(req, Send):
                self._send(req)
            self._die(crash, flush=True)
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
        if req.topic == CLIENT_UPDATE and self.faults.corrupt:
            data, spec, round_ = faultlib.damage(self.faults, self.node, req.data, self.scenario_seed)
            if spec is not None:
                self.emit("fault", fault="corrupt", corruption=spec.kind, round=round_)
                req = Send(req.topic, data, req.to)
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
        while True:
            held = self._take_held(req.topics)
            if held is not None:
                return held
            wake = req.deadline
            due = [t for t, _, m in self._held if m.topic in req.topics]
            if due:
                wake = min(due) if wake is None else min(wake, min(due))
            timeout = None if wake is None else max(0.0, wake - self.now())
            msg = self.transport.recv(list(req.topics), timeout_s=timeout)
            if msg is None:
                if req.deadline is not None and self.now() >= req.deadline:
                    return None
                continue  # a held message is due
            sent_at = msg.sent_at - self.t0 if msg.sent_at else self.now()
            received_at = msg.received_at - self.t0
            self.bytes_received += len(msg.data)
            self.emit("deliver", src=msg.src, topic=msg.topic, bytes=len(msg.data),
                      sent_at=round(sent_at, 6), comm_s=round(received_at - sent_at, 6))
            got = Message(msg.topic, msg.src, msg.data, sent_at=sent_at, received_at=received_at)
            if self.delivery is None and not self.faults.dropout_p:
                return got
            self._inject(got)

    def _inject(self, msg: Message) -> None:
        """What the scenario's faults make of one received message: held copies (maybe none)."""
        now = self.now()
        if self.faults.dropout_p and msg.topic == TRAIN_CMD:
            cmd = faultlib.peek(msg.data)
            if isinstance(cmd, TrainCmd) and faultlib.drops_round(self.scenario_seed, self.rank, cmd.round,
                                                                  self.faults.dropout_p):
                self.emit("dropout", round=cmd.round)
                return
        copies = self.delivery.copies(msg.src, self.node, now) if self.delivery is not None else [0.0]
        if not copies:
            why = "partition" if self.delivery.partitioned(msg.src, self.node, now) else "message_lost"
            self.emit("fault", fault=why, src=msg.src, topic=msg.topic, bytes=len(msg.data))
        elif len(copies) > 1:
            self.emit("fault", fault="duplicate", src=msg.src, topic=msg.topic)
        for delay in copies:
            self._held_seq += 1
            heapq.heappush(self._held, (now + delay, self._held_seq, msg))

    def _take_held(self, topics) -> Message | None:
        now = self.now()
        for i, (due, _, msg) in enumerate(sorted(self._held)):
            if due > now:
                return None
            if msg.topic in topics:
                self._held.remove((due, _, msg))
                heapq.heapify(self._held)
                return msg
        return None

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

