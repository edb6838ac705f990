"""The one driver: resumes a role with the answers to its requests, in either world.

A role (``core.fl``, ``core.ddp``) is a generator of requests
(``core.runtime.requests``).  The driver answers each one with the runtime's
*primitives* (``Primitives``: send, receive with a deadline, account for a
job's time, wait for peers, idle, now, log, save, die) and is the ``Context``
the role sees.  emu supplies the primitives over SimPy (``emu.node``), real
over CycloneDDS (``real.node``); everything else is here, once:

- the loop that resumes the role, and what an error means: a job that fails
  (``Compute.fn`` raised) or an unknown request is thrown into the role, which
  decides; a primitive that fails is the runtime's failure and ends the node;
- the fault layer over the primitives (``core.runtime.faults`` decides, the
  driver carries out, the same way in both worlds):

  * crashes at protocol points: a role passes ``Point``s; a crash planned
    there lands at once, or halfway through the next job (after half its
    modelled duration: the work itself is lost, so it is not done), or halfway
    through the next send (half of the message is on the wire), or right after
    the next send.  Then ``Primitives.die``: emu marks the node down (and
    restarts it if the fault says so), real flushes what was sent and exits;
  * deliveries: each message the node receives is lost, duplicated, held back
    or cut off by a partition, decided at its arrival time from the node's own
    stream; a client sits out the rounds ``faults.dropout_p`` drops;
  * corrupt updates, damaged as they leave.

Primitives are generators: emu's yield SimPy events, so the driver runs as a
SimPy process; real's block and return without yielding (``blocking``), so
``run_blocking`` finishes the whole drive in one step.
"""

from __future__ import annotations

import functools
import heapq
from typing import Any, Callable, Generator, Protocol

from dtemu.core import events as ev
from dtemu.core.runtime import faults as faultlib
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.core.runtime.limits import EventLimiter
from dtemu.core.runtime.requests import (Compute, Evaluate, Evaluations, Message, Point, Recv, Send, Sleep,
                                         WaitPeers)
from dtemu.core.wire.auth import Sealer, SealingLayer

Gen = Generator[Any, Any, Any]


class Primitives(Protocol):
    """What a runtime supplies; each operation that takes time is a generator."""

    node: str
    incarnation: int  # sealed messages count from here (a restarted node goes on above its last life)
    timer: ComputeTimer  # the node's compute model
    bytes_rejected: int  # of messages its roles refused, over every life of the node

    def now(self) -> float: ...

    def log(self, event: dict) -> None: ...

    def save_checkpoint(self, data: bytes) -> str: ...

    def send(self, topic: str, data: bytes, to: str | None) -> Gen:
        """Returns the number of receivers when the message has left (emu: its flows ended)."""

    def send_half(self, topic: str, data: bytes, to: str | None) -> Gen:
        """Put the first half of the message on the wire (a crash cuts the rest)."""

    def recv(self, topics: tuple[str, ...], deadline: float | None) -> Gen:
        """The oldest message on ``topics``, or None once ``deadline`` passed."""

    def computed(self, req: Compute, elapsed: float) -> Gen:
        """Account for a job that ran for ``elapsed`` seconds of this clock (emu: advance
        by its modelled duration; real: stage a straggler's slowdown)."""

    def idle(self, seconds: float) -> Gen: ...

    def wait_peers(self, peers: tuple[str, ...], deadline: float | None) -> Gen: ...

    def die(self, crash: faultlib.Crash) -> None:
        """The node crashes here (emu: down, maybe restarted later; real: the process exits)."""

    # Optional (real): ``evaluate_aside(fn, done)`` runs ``fn`` off the role's path and calls
    # ``done(value, error)`` from wherever it ran; ``evaluated()`` waits until all have been done.
    # A runtime without them evaluates in the role's path, in zero modelled time (emu).


def blocking(fn: Callable) -> Callable[..., Gen]:
    """A blocking call as a primitive: a generator that returns ``fn``'s value without yielding."""

    @functools.wraps(fn)
    def primitive(*args, **kwargs):
        return fn(*args, **kwargs)
        yield  # pragma: no cover  (makes this a generator)

    return primitive


def run_blocking(drive: Gen) -> Any:
    """Run a drive whose primitives never yield (real mode) to its end."""
    try:
        request = next(drive)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError(f"a blocking runtime's primitive yielded {request!r}")


class Crashed:
    """What ``Driver.run`` returns when the node crashed at a protocol point."""

    def __repr__(self) -> str:
        return "CRASHED"


CRASHED = Crashed()


class Driver(SealingLayer):
    """Drives one role on one node; also the role's ``Context``."""

    def __init__(self, prims: Primitives, faults: faultlib.NodeFaults, key: bytes | None = None):
        self.prims = prims
        self.node = prims.node
        # The sealing layer (core.wire.auth): every role seals what it sends and opens what it
        # receives through it; without a key both are the identity.  One per life: a restarted
        # node's sequence numbers go on above its last life's (its incarnation).
        self.sealer = Sealer(key, self.node, getattr(prims, "incarnation", 0))
        self.faults = faults
        self.limiter = EventLimiter()
        self.bytes_rejected = 0  # of messages the role read and refused
        self.armed: faultlib.Crash | None = None
        self._held: list[tuple[float, int, Message]] = []  # delayed or duplicated deliveries
        self._held_seq = 0
        # Runs Compute.job in worker processes (emu --jobs N; see emu.executor), or None: fn here.
        self._executor = getattr(prims, "executor", None)
        self._evaluations: list[tuple[float, int, Any]] = []  # (time asked, round, accuracy) of Evaluate

    # --- Context -------------------------------------------------------
    @property
    def incarnation(self) -> int:
        return self.prims.incarnation

    def now(self) -> float:
        return self.prims.now()

    def emit(self, kind: str, **fields: Any) -> None:
        limit = getattr(kind, "limit", None)
        if limit is not None:  # one event per message an outsider may send: rate-limited per origin
            origin = str(fields.get("src") or fields.get("client") or "")
            admitted, held = self.limiter.admit(kind, origin, limit, self.prims.now())
            if held:
                self._log(ev.EVENTS_SUPPRESSED, {"of": str(kind), "origin": origin, "suppressed": held})
            if not admitted:
                return
        self._log(kind, fields)

    def _log(self, kind: str, fields: dict, t: float | None = None) -> None:
        at = self.prims.now() if t is None else t
        self.prims.log({"t": round(at, 9), "node": self.node, "kind": kind, **fields})

    def refused(self, msg: Message) -> None:
        """The role read ``msg`` and refused it: its bytes count apart from the traffic it accepted."""
        self.bytes_rejected += len(msg.data)
        self.prims.bytes_rejected += len(msg.data)

    def _flush_suppressed(self) -> None:
        for kind, origin, held in self.limiter.drain():
            self._log(ev.EVENTS_SUPPRESSED, {"of": kind, "origin": origin, "suppressed": held})

    def save_checkpoint(self, data: bytes) -> str:
        return self.prims.save_checkpoint(data)


    # --- the loop ------------------------------------------------------
    def run(self, role) -> Gen:
        """Resume ``role`` until it returns (its value) or crashes (``CRASHED``); its errors propagate."""
        value, error = None, None
        while True:
            try:
                request = role.throw(error) if error is not None else role.send(value)
            except StopIteration as stop:
                self._flush_suppressed()
                return stop.value
            value, error = None, None
            if isinstance(request, Point):
                crash = self._passed(request)
                if crash is None:
                    continue
                if crash.landing != faultlib.NOW:
                    self.armed = crash
                    continue
                return self._die(role, crash)
            if self.armed is not None and isinstance(request, (Send, Compute)):
                yield from self._land(self.armed, request)
                return self._die(role, self.armed)
            if isinstance(request, Compute):
                value, error = yield from self._compute(request)
            elif isinstance(request, Evaluate):
                yield from self._evaluate(request)
            elif isinstance(request, Evaluations):
                if hasattr(self.prims, "evaluated"):
                    yield from self.prims.evaluated()
                value = list(self._evaluations)
            elif isinstance(request, Send):
                value = yield from self._send(request)
            elif isinstance(request, Recv):
                value = yield from self._recv(request)
            elif isinstance(request, Sleep):
                yield from self.prims.idle(max(0.0, request.seconds))
            elif isinstance(request, WaitPeers):
                value = yield from self.prims.wait_peers(request.peers, request.deadline)
            else:
                error = TypeError(f"{self.node}: unknown request {request!r}")

    # --- work ----------------------------------------------------------
    def _compute(self, request: Compute) -> Gen:
        """(value, error) of the job; a failed job's error is the role's to handle."""
        if request.job is not None and self._executor is not None:
            # Handed to a worker process now, taken at the job's virtual end: the jobs of
            # every client that starts before then run at the same time, and the result
            # is the one fn would give (core.ml.jobs), so nothing else changes.
            pending = self._executor.submit(request.job)
            try:
                yield from self.prims.computed(request, 0.0)
            except BaseException:  # the node crashed meanwhile: the result is not wanted
                self._executor.forget(pending)
                raise
            try:
                return self._executor.result(pending, self), None
            except Exception as err:
                return None, err
        started = self.prims.now()
        try:
            value = request.fn()
        except Exception as err:
            return None, err
        yield from self.prims.computed(request, self.prims.now() - started)
        return value, None

    def _evaluate(self, request: Evaluate) -> Gen:
        asked = self.prims.now()
        slot = len(self._evaluations)
        self._evaluations.append((asked, request.round, None))

        def done(accuracy, error=None) -> None:  # real: called from the evaluating thread
            self._evaluations[slot] = (asked, request.round, accuracy)
            fields = {"round": request.round, "accuracy": accuracy}
            self._log(ev.EVAL, {**fields, "error": f"{type(error).__name__}: {error}"} if error else fields, t=asked)

        if hasattr(self.prims, "evaluate_aside"):
            self.prims.evaluate_aside(request.fn, done)
            return
        value, error = yield from self._compute(Compute(request.fn, samples=request.samples, kind="eval",
                                                        job=request.job))
        done(value, error)

    # --- crashes at protocol points -------------------------------------
    def _passed(self, point: Point) -> faultlib.Crash | None:
        crash = self.faults.crash_at(point.name, point.round)
        if crash is not None:
            self.emit(ev.FAULT, fault="crash", at=crash.spec.at, round=crash.spec.round)
        return crash

    def _land(self, crash: faultlib.Crash, request) -> Gen:
        """Carry out ``request`` as far as ``crash`` lets it get."""
        if crash.landing == faultlib.IN_COMPUTE and isinstance(request, Compute):
            # Halfway through the job: its result dies with the node, so it is not even computed.
            yield from self.prims.idle(self.prims.timer.duration(request.samples, request.kind,
                                                                 now=self.prims.now(), nbytes=request.nbytes) / 2)
        elif crash.landing == faultlib.IN_SEND and isinstance(request, Send):
            yield from self.prims.send_half(request.topic, request.data, request.to)
        elif crash.landing == faultlib.AFTER_SEND and isinstance(request, Send):
            yield from self._send(request)

    def _die(self, role, crash: faultlib.Crash) -> Crashed:
        role.close()  # the role's state is gone with the node
        self.prims.die(crash)
        return CRASHED

    # --- sending -------------------------------------------------------
    def _send(self, req: Send) -> Gen:
        data, damage = self.faults.outgoing(req.topic, req.data)
        if damage is not None:
            self.emit(ev.FAULT, fault="corrupt", corruption=damage.spec.kind, round=damage.round)
        return (yield from self.prims.send(req.topic, data, req.to))

    # --- receiving -----------------------------------------------------
    def _recv(self, req: Recv) -> Gen:
        while True:
            wake = req.deadline
            if self._held:  # (none, but under delivery faults: skip the search on every message)
                held = self._take_held(req.topics)
                if held is not None:
                    return held
                due = [t for t, _, m in self._held if m.topic in req.topics]
                if due:
                    wake = min(due) if wake is None else min(wake, min(due))
            msg = yield from self.prims.recv(req.topics, wake)
            if msg is None:
                if req.deadline is not None and self.prims.now() >= req.deadline:
                    return None
                continue  # a held message is due
            self.emit(ev.DELIVER, src=msg.src, topic=msg.topic, bytes=len(msg.data),
                      sent_at=round(msg.sent_at, 9), comm_s=round(msg.received_at - msg.sent_at, 9))
            if not self.faults.on_receive:
                return msg
            self._arrive(msg)

    def _arrive(self, msg: Message) -> None:
        """What the scenario's faults make of one received message: held copies (maybe none)."""
        dropped = self.faults.sits_out(msg)
        if dropped is not None:
            self.emit(ev.DROPOUT, round=dropped)
            return
        copies, why = self.faults.copies(msg)
        if why is not None:
            extra = {"bytes": len(msg.data)} if why != "duplicate" else {}
            self.emit(ev.FAULT, fault=why, src=msg.src, topic=msg.topic, **extra)
        for delay in copies:
            self._held_seq += 1
            heapq.heappush(self._held, (msg.received_at + delay, self._held_seq, msg))

    def _take_held(self, topics) -> Message | None:
        now = self.prims.now()
        for entry in sorted(self._held):
            due, _, msg = entry
            if due > now:
                return None
            if msg.topic in topics:
                self._held.remove(entry)
                heapq.heapify(self._held)
                return msg
        return None
