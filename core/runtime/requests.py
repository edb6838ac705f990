"""What a role may ask of the runtime that drives it.

A role (controller, client, worker) is a generator.  It yields one of the
requests below and is resumed with the answer, so the same role code runs in
SimPy's virtual time (``emu``) and for real over DDS (``real``): only the
driver differs.  Instantaneous things that take no time in either world
(reading the clock, logging an event, saving a checkpoint) are plain calls on
the ``Context`` the role is given.

    def client(ctx, ...):
        msg = yield Recv((TRAIN_CMD,), deadline=None)
        result = yield Compute(train, samples=6000)
        yield Point(UPLOAD, round=3)
        yield Send(CLIENT_UPDATE, payload, to="controller")

The driver that answers them is written once (``core.runtime.driver``);
emu and real supply only its primitives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from dtemu.core.wire.auth import Sealer, SealingLayer


class Buffers:
    """The bytes of a message given as its pieces (a frame's header and its body), so that the
    runtime copies the body once where it copies anyway instead of after a join: real mode
    straight into its shared-memory slot (real.shm), emu when it hands the message over.
    ``len()`` is the number of bytes; ``bytes()`` joins them."""

    __slots__ = ("parts", "nbytes")

    def __init__(self, *parts):
        self.parts = tuple(memoryview(p).cast("B") for p in parts)
        self.nbytes = sum(len(p) for p in self.parts)

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


def joined(data) -> bytes:
    """``data`` as one bytes-like object (a ``Buffers`` joined)."""
    return bytes(data) if isinstance(data, Buffers) else data


@dataclass(frozen=True)
class Send:
    """Send ``data`` on ``topic``; to one node, to the nodes of a tuple (a sampled round's
    command), or to every subscriber if ``to`` is None.

    Returns when the bytes have left the sender (in emu: when its flows ended).
    """

    topic: str
    data: bytes | Buffers
    to: str | tuple[str, ...] | None = None


@dataclass(frozen=True)
class Recv:
    """Take the oldest message on one of ``topics``; wait until ``deadline`` at most.

    ``deadline`` is an absolute time on the runtime's clock; None waits forever,
    a deadline in the past only polls.  Returns a ``Message`` or None on timeout.
    """

    topics: tuple[str, ...]
    deadline: float | None = None


@dataclass(frozen=True)
class Compute:
    """Run ``fn()`` and return its result.

    In emu the call runs for real but virtual time advances by the modelled
    duration of ``samples`` samples of work of ``kind`` on this node (``eval``
    work is free by default: evaluation is the experimenter's instrument, not
    part of the system).  In real mode the wall clock is what it is.
    """

    fn: Callable[[], Any]
    samples: int = 0
    kind: str = "train"
    # CPU work outside training (``kind`` one of core.runtime.compute.CPU_OPS): the bytes it works
    # on, priced in emu by the node's ``compute.cpu.<kind>_s_per_mb``.
    nbytes: int = 0
    # The same work as a picklable description (core.ml.jobs: TrainJob, EvalJob), or None: a runtime
    # with worker processes (emu --jobs N) may run it there instead of calling fn, for the
    # same result; the modelled duration does not depend on the result, so the job can be
    # handed out when the Compute starts and its result taken at its virtual end.
    job: Any = None


def cpu_work(costs, op: str, nbytes: int, fn: Callable[[], Any]):
    """``fn()``: a role's CPU work ``op`` (core.runtime.compute.CPU_OPS) on ``nbytes``, as a ``Compute``
    that emu times where ``costs`` (the node's ``compute.cpu``) prices ``op``; otherwise called in
    place, taking no request: an unpriced op moves no event."""
    if nbytes and getattr(costs, f"{op}_s_per_mb", 0.0):
        return (yield Compute(fn, kind=op, nbytes=nbytes))
    return fn()


@dataclass(frozen=True)
class Evaluate:
    """Measure the model of round ``round`` (``fn()``: its accuracy; ``job``: the same as an
    ``EvalJob``, for worker processes); returns at once, with nothing.

    Evaluation is the experimenter's instrument, not part of the emulated system, so it
    takes none of the run's time.  The driver logs ``eval`` (round, accuracy), stamped with
    this request's time, once the number is there: in emu at once, in zero virtual time (as
    a ``Compute`` of kind ``eval``); in real, where a rank's clock is the wall's, aside from
    the role (``Primitives.evaluate_aside``), so that the rounds after it do not start the
    evaluation's seconds late.  ``Evaluations`` gives them back.
    """

    fn: Callable[[], Any]
    round: int
    samples: int = 0
    job: Any = None


@dataclass(frozen=True)
class Evaluations:
    """Every ``Evaluate`` of this role so far, as (time, round, accuracy) in the order asked;
    waits for those still running.  A failed one has accuracy None."""


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class WaitPeers:
    """Wait until ``peers`` are all matched (reachable), or until ``deadline``.

    Returns the frozenset of peers matched by then.
    """

    peers: tuple[str, ...]
    deadline: float | None = None


@dataclass(frozen=True)
class Point:
    """The role has reached a point of its protocol (``core.runtime.points``); no time passes.

    A crash the scenario plans there (``faults.crashes``) lands now or in the
    role's next request; otherwise the role goes on at once."""

    name: str
    round: int


@dataclass(frozen=True)
class Message:
    topic: str
    src: str
    data: bytes
    sent_at: float = 0.0
    received_at: float = 0.0


class Context(Protocol):
    """What the runtime lends a role for instantaneous things."""

    node: str

    def now(self) -> float:
        """Seconds on the runtime's clock (virtual in emu, monotonic in real)."""

    def emit(self, kind: str, **fields: Any) -> None:
        """Record an event (events.jsonl, the dashboard); t and node are added."""

    def save_checkpoint(self, data: bytes) -> str:
        """Store a checkpoint atomically; returns where it went."""

    def refused(self, msg: "Message") -> None:
        """The role read ``msg`` and refused it (its bytes are not counted as accepted traffic)."""

    # The sealing layer (core.wire.auth), the identity without the run's key: a role seals what it
    # sends and opens what it receives through it, and refuses what ``open`` raises (AuthError).
    sealed: bool

    def seal(self, topic: str, round_: int, data: bytes) -> bytes: ...

    def open(self, msg: "Message") -> bytes: ...


@dataclass
class RecordingContext(SealingLayer):
    """A Context for tests and tools: a fixed or advancing clock, events in a list."""

    node: str = "test"
    time: float = 0.0
    events: list[dict] = field(default_factory=list)
    checkpoints: list[bytes] = field(default_factory=list)
    bytes_rejected: int = 0
    key: bytes | None = None  # the run's key: seal and open as a driver would

    def __post_init__(self):
        self.sealer = Sealer(self.key, self.node)

    def now(self) -> float:
        return self.time

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"t": self.time, "node": self.node, "kind": kind, **fields})

    def save_checkpoint(self, data: bytes) -> str:
        self.checkpoints.append(data)
        return f"memory:{len(self.checkpoints) - 1}"

    def refused(self, msg: Message) -> None:
        self.bytes_rejected += len(msg.data)
