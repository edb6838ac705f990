"""Real mode's primitives: the driver's operations over CycloneDDS, in wall-clock time.

``core.runtime.driver.Driver`` runs the role and its faults; this supplies
what it asks of the runtime, each a blocking call (``blocking``: a primitive
that never yields, so ``run_blocking`` drives the role to its end):

- send:       ``DdsTransport.send`` (frames of 1 MiB); the number of readers.
- send_half:  the first half of the message's frames (a crash mid-upload).
- recv:       ``DdsTransport.recv`` with the time left to the deadline.
- computed:   a node with ``compute.slowdown`` > 1 (or jitter) idles for the
              rest of its stretched time, so a straggler can be staged on one machine.
- wait_peers: every peer present (``ctl/hello``), matched as a reader of
              the topics this node publishes and as a writer of those it reads, and its clock measured
              (``real.clock_sync``; at most ``WAIT_S``: one that never answers stays at 0).
- die:        flush what was sent, log ``node_down`` and exit with
              ``CRASH_EXIT + i`` (``real launch`` restarts the rank if the fault says so).

Time is ``time.monotonic()``, counted from ``epoch`` (the instant ``real
launch`` gave every rank) so that the ranks' events line up.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from typing import Any, Iterable

from dtemu.core import events as ev
from dtemu.core.runtime import faults as faultlib
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.driver import blocking
from dtemu.core.runtime.requests import Compute, Message
from dtemu.host.rundir import RunDir

from .aside import Aside
from .clock_sync import WAIT_S as CLOCK_WAIT_S
from .paced_links import PacedLinks
from .reassembly import RejectLimiter
from .timer_lateness import Lateness
from .transport import DdsTransport

# A process that crashes at faults.crashes[i] exits with CRASH_EXIT + i (i < 100).
CRASH_EXIT = 100


class RealPrimitives:
    def __init__(self, name: str, transport: DdsTransport, run: RunDir, publishes: Iterable[str],
                 timer: ComputeTimer, epoch: float | None = None, readers: dict | None = None,
                 pace: float | None = None, links: PacedLinks | None = None,
                 subscribes: Iterable[str] = (), writers: dict | None = None):
        self.node = name
        # Under a time scale (real launch): a training job takes the scenario's modelled time
        # times this, so every rank keeps the scenario's relative timing (see ``computed``).
        self.pace = pace
        # Under a launch on one machine: messages take the scenario's links' time (real.paced_links).
        self.links = links
        self._held: list[tuple[float, int, Message]] = []  # received, not due yet: (due, arrival, message)
        self._aside = Aside(f"{name}-aside")  # its evaluations (core.runtime.requests.Evaluate)
        self._arrivals = 0
        # topic -> the nodes that read it (None: every peer reads every topic this node publishes)
        self.readers = readers
        # topic -> the nodes that write it, of the topics this node reads (None: not waited for)
        self.writers = writers
        self.subscribes = tuple(subscribes)
        # Sealed messages count from here: a restarted process goes on above its previous life.
        self.incarnation = int(time.time() * 1000)
        self.transport = transport
        self.run = run
        self.publishes = tuple(publishes)
        self.timer = timer
        start = transport.clock.wall_ns() / 1e9  # (a clock with an injected error is off here too)
        self.t0 = time.monotonic() - (start - epoch if epoch is not None else 0.0)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bytes_rejected = 0  # of messages its role refused (the driver counts them here)
        self.lateness = Lateness()  # how late its timers woke (a fidelity monitor: real.monitors)
        # Frames the transport drops (malformed, orphan, incomplete) become frame_rejected
        # events, rate-limited per reason so a flood cannot fill the disk.
        transport.on_reject = RejectLimiter(self._emit)  # called from the receive thread

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, event: dict) -> None:
        self.run.event(event)

    def _emit(self, kind: str, **fields: Any) -> None:
        self.log({"t": round(self.now(), 9), "node": self.node, "kind": kind, **fields})

    def save_checkpoint(self, data: bytes) -> str:
        return self.run.save_checkpoint(data)

    @blocking
    def send(self, topic: str, data: bytes, to: str | tuple[str, ...] | None) -> int:
        if self.links is not None:  # the message leaves once the scenario's uplink has carried it
            receivers = list(to) if isinstance(to, tuple) else [to] if to is not None else self._reader_list(topic)
            self._sleep_until(self.links.send_done(self.now(), len(data), receivers))
        if isinstance(to, tuple):  # a sampled round's command: one write per client asked
            for dst in to:
                self.transport.send(topic, data, to=dst)
            self.bytes_sent += len(data) * len(to)
            return len(to)
        self.transport.send(topic, data, to=to)
        receivers = 1 if to is not None else self._readers_of(topic)
        self.bytes_sent += len(data) * receivers
        return receivers

    @blocking
    def send_half(self, topic: str, data: bytes, to: str | tuple[str, ...] | None) -> None:
        frames = -(-len(data) // self.transport.frame_bytes)
        if isinstance(to, tuple):  # a crash halfway: half of the first write
            if not to:
                return
            to = to[0]
        self.transport.send(topic, data, to=to, only_frames=max(0, frames // 2))

    def _readers_of(self, topic: str) -> int:
        """Peers reading ``topic`` (by name, cached by the transport)."""
        return len(self._reader_list(topic))

    def _reader_list(self, topic: str) -> list[str]:
        return sorted({r for r in self.transport.reader_names(topic) if r != self.node})

    @blocking
    def recv(self, topics: tuple[str, ...], deadline: float | None) -> Message | None:
        if self.links is None:
            return self._take(topics, deadline)
        # Paced: a message is the role's once the path's latency has passed; until then it is held
        # (in arrival order among those due together), and the role waits for it or its deadline.
        while True:
            mine = [h for h in self._held if h[2].topic in topics]
            first = min(mine, default=None, key=lambda h: h[:2])
            if first is not None and first[0] <= self.now():
                self._held.remove(first)
                return replace(first[2], received_at=max(first[2].received_at, first[0]))
            waits = [t for t in (deadline, first[0] if first else None) if t is not None]
            msg = self._take(topics, min(waits) if waits else None)
            if msg is None:
                if first is not None and (deadline is None or first[0] <= deadline):
                    continue  # the held message is due now
                return None
            self._arrivals += 1
            self._held.append((self.links.due(msg.src, msg.sent_at, msg.received_at), self._arrivals, msg))

    def _take(self, topics: tuple[str, ...], deadline: float | None) -> Message | None:
        """The transport's next message on ``topics`` before ``deadline``, on this rank's clock."""
        timeout = None if deadline is None else max(0.0, deadline - self.now())
        msg = self.transport.recv(list(topics), timeout_s=timeout)
        if msg is None:
            if deadline is not None:
                self.lateness.note(self.now() - deadline)
            return None
        self.bytes_received += len(msg.data)
        received_at = msg.received_at - self.t0
        sent_at = msg.sent_at - self.t0 if msg.sent_at else received_at
        return Message(msg.topic, msg.src, msg.data, sent_at=sent_at, received_at=received_at)

    @blocking
    def computed(self, req: Compute, elapsed: float) -> None:
        started = self.now() - elapsed  # the slowdown in force when the job started
        if self.pace and self.timer.modelled:
            # The job lasts what emu models (slowdown and jitter included), stretched to this
            # machine.  Stretching the *measured* time instead misplaces a straggler when ranks
            # share the cores: its idling frees the cores, so the others train faster meanwhile,
            # and its own measured time is short (it trained while others were done).
            self._sleep_until(started + self.pace * self.timer.duration(req.samples, req.kind, now=started))
            return
        stretch = self.timer.stretch(req.kind, now=started)
        if stretch != 1.0:
            self._sleep_until(started + stretch * elapsed)

    @blocking
    def idle(self, seconds: float) -> None:
        self._sleep_until(self.now() + seconds)

    def _sleep_until(self, t: float) -> None:
        wait = t - self.now()
        if wait > 0:
            time.sleep(wait)
            self.lateness.note(self.now() - t)

    def evaluate_aside(self, fn, done) -> None:
        """An evaluation off the role's path (real.aside): the rounds after it start on time."""
        self._aside.submit(fn, done)

    @blocking
    def evaluated(self) -> None:
        self._aside.join()

    @blocking
    def wait_peers(self, peers: tuple[str, ...], deadline: float | None) -> frozenset:
        def left() -> float:
            return 3600.0 if deadline is None else max(0.0, deadline - self.now())

        missing = set(self.transport.wait_peers(list(peers), timeout_s=left()))
        # matched as readers of what we publish, then as writers of what we read: DDS discovers the
        # two directions apart, and a message written before the other side knows its writer is lost
        for topics, who, role in ((self.publishes, self.readers, "readers"),
                                  (self.subscribes if self.writers is not None else (), self.writers, "writers")):
            present = [p for p in peers if p not in missing]
            if present and topics:
                missing |= self._unmatched(topics, who, present, left(), role)
        # and their clocks, so that the first messages' times read right (real.clock_sync)
        self.transport.clock.wait([p for p in peers if p not in missing], timeout_s=min(left(), CLOCK_WAIT_S))
        return frozenset(p for p in peers if p not in missing)

    def _unmatched(self, topics, who: dict | None, present: list[str], timeout_s: float, role: str) -> set:
        """Of ``present``, the peers not matched by ``timeout_s`` as ``role`` of ``topics``, where they
        are one (``who``: topic -> nodes; None: every peer is)."""
        want = {t: [p for p in present if who is None or p in who.get(t, ())] for t in topics}
        unmatched = self.transport.wait_matched({t: names for t, names in want.items() if names},
                                                timeout_s=timeout_s, role=role)
        return {n for names in unmatched.values() if isinstance(names, (list, tuple, set)) for n in names}

    def die(self, crash: faultlib.Crash) -> None:
        """The crash: what was sent is flushed (as emu's sends end when delivered), then no
        summary.  The participant is deleted on the way out, so the peers learn of the death at
        once, as emu's do: a reliable writer that still counts a dead reader stops once its
        history is full, until the dead one's lease ends (10 s), and a restarted controller
        got its clients' resent updates that late (docs/notebook/, entry 45).  A process killed
        from outside is found by the lease."""
        self.transport.flush(timeout_s=5.0)
        self._emit(ev.NODE_DOWN)
        closing = threading.Thread(target=self.transport.close, daemon=True)
        closing.start()
        closing.join(timeout=3.0)  # (bounded: a crash does not wait on a stuck clean-up)
        os._exit(CRASH_EXIT + crash.index)
