"""Faults of a scenario, decided once for both runtimes (no I/O, no clock).

The driver (``core.runtime.driver``) carries faults out; this module only
decides them, from the scenario and its seed, so that emu and real mode
inject the same thing:

- ``CrashPlan``: crashes at protocol points (``faults.crashes``).  A role
  passes named points (``core.runtime.requests.Point``); ``CRASH_POINTS`` maps
  each ``at:`` of a crash to the point that arms it and how it lands (``NOW``:
  the node dies there; ``IN_COMPUTE`` / ``IN_SEND``: halfway through the next
  training job / upload; ``AFTER_SEND``: as soon as the next message has gone
  out).  Each crash fires once, even if the restarted node passes the point again.
- ``DeliveryFaults``: per received message, lost / duplicated / held back,
  and partitions; draws come from the receiving node's own seeded stream, in
  the order it receives.
- ``corrupt_update``: a client update damaged as ``faults.corrupt`` says.
- ``NodeFaults``: all of it for one node's life, as its driver asks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtemu.core.compression import codecs
from dtemu.core.errors import DecodeError
from dtemu.core.runtime import points
from dtemu.core.runtime.requests import Message
from dtemu.core.runtime.fault_spec import CorruptSpec, CrashSpec, FaultSpec
from dtemu.core.wire import auth, messages
from dtemu.core.wire.messages import ClientUpdate, TrainCmd
from dtemu.core.wire.topics import CLIENT_UPDATE, TRAIN_CMD

NOW, IN_COMPUTE, IN_SEND, AFTER_SEND = "now", "in_compute", "in_send", "after_send"

# faults.crashes[].at: (the protocol point that arms the crash, how it lands)
CRASH_POINTS = {
    "before_train": (points.TRAIN, NOW),
    "during_train": (points.TRAIN, IN_COMPUTE),
    "mid_upload": (points.UPLOAD, IN_SEND),
    "after_upload": (points.UPLOADED, NOW),
    "mid_round": (points.ROUND, AFTER_SEND),
    "before_checkpoint": (points.AGGREGATED, NOW),
    "after_checkpoint": (points.CHECKPOINTED, NOW),
}

_DELIVERY_STREAM = 0xFA17  # keeps these draws apart from other uses of the seed
_CORRUPT_STREAM = 0xBAD
_DROPOUT_STREAM = 0x0D0B


@dataclass(frozen=True)
class Crash:
    index: int  # in faults.crashes
    spec: CrashSpec
    landing: str  # NOW, IN_COMPUTE, IN_SEND or AFTER_SEND


class CrashPlan:
    def __init__(self, faults: FaultSpec, fired: set[int] = frozenset()):
        self.crashes = list(faults.crashes)
        # Crashes that already happened (real mode: told by the launcher to the restarted process).
        self.fired = set(fired)
        self._last: dict[str, CrashSpec] = {}

    def for_node(self, node: str) -> bool:
        return any(c.node == node for c in self.crashes)

    def trigger(self, node: str, point: str, round_: int) -> Crash | None:
        """The crash that ``node`` passing ``point`` of ``round_`` sets off, marked as fired."""
        for i, spec in enumerate(self.crashes):
            armed_at, landing = CRASH_POINTS[spec.at]
            if i in self.fired or spec.node != node or point != armed_at or round_ != spec.round:
                continue
            self.fired.add(i)
            self._last[node] = spec
            return Crash(i, spec, landing)
        return None

    def restart_after(self, node: str) -> float | None:
        """Seconds until ``node`` restarts after its latest crash (None: it stays down)."""
        spec = self._last.get(node)
        return None if spec is None else spec.restart_after_s


class DeliveryFaults:
    """What happens to one delivery: ``copies(src, dst, t)`` is the list of extra
    delays of the copies that arrive ([] = lost, two entries = duplicated)."""

    def __init__(self, faults: FaultSpec, seed: int, stream: int = 0):
        self.faults = faults
        self.rng = np.random.default_rng([seed, _DELIVERY_STREAM, stream])

    def partitioned(self, a: str, b: str, t: float) -> bool:
        for p in self.faults.partitions:
            if p.start_s <= t < p.end_s and ((a in p.nodes) != (b in p.nodes)):
                return True
        return False

    def copies(self, src: str, dst: str, t: float) -> list[float]:
        f = self.faults
        if self.partitioned(src, dst, t):
            return []
        if f.message_loss and self.rng.random() < f.message_loss:
            return []
        n = 2 if f.duplicate_p and self.rng.random() < f.duplicate_p else 1
        if not f.reorder_s:
            return [0.0] * n
        return [float(d) for d in self.rng.uniform(0.0, f.reorder_s, size=n)]


def peek(data: bytes):
    """The wire message in ``data``, sealed or not, unverified (None if it is not one).

    Fault injection looks inside messages to pick its targets; it must not care
    whether a key seals them."""
    try:
        return messages.decode(auth.peek_inner(data))
    except DecodeError:
        return None


def drops_round(seed: int, rank: int, round_: int, p: float) -> bool:
    """Does client ``rank`` sit out ``round_`` (faults.dropout_p)?"""
    if p <= 0:
        return False
    return bool(np.random.default_rng([seed, _DROPOUT_STREAM, rank, round_]).random() < p)


def damage(faults: FaultSpec, node: str, data: bytes, seed: int) -> tuple[bytes, CorruptSpec | None, int]:
    """(``data`` as ``faults.corrupt`` damages it, the spec applied or None, the round)."""
    up = peek(data) if faults.corrupt else None
    if not isinstance(up, ClientUpdate):
        return data, None, -1
    spec = corruption_for(faults, node, up.round)
    if spec is None:
        return data, None, up.round
    return corrupt_update(data, spec, seed=seed * 1000003 + up.round), spec, up.round


def corruption_for(faults: FaultSpec, node: str, round_: int) -> CorruptSpec | None:
    for spec in faults.corrupt:
        if spec.node == node and (not spec.rounds or round_ in spec.rounds):
            return spec
    return None


def corrupt_update(data: bytes, spec: CorruptSpec, seed: int) -> bytes:
    """``data`` (an encoded ClientUpdate) damaged as ``spec`` says.

    Anything that is not a plain ClientUpdate (a sealed one, say) is damaged
    by flipping bytes, which is what corruption does to a message it cannot read.
    """
    rng = np.random.default_rng([seed, _CORRUPT_STREAM])
    try:
        up = messages.decode(data)
        if not isinstance(up, ClientUpdate):
            raise DecodeError("not an update")
    except DecodeError:
        raw = bytearray(data)
        for i in rng.integers(0, len(raw), size=max(1, len(raw) // 1000)):
            raw[i] ^= 0xFF
        return bytes(raw)
    if spec.kind == "stale":
        return messages.encode(_replace(up, round=max(0, up.round - 1)))
    if spec.kind == "garbage":
        return messages.encode(_replace(up, packet=rng.bytes(len(up.packet))))
    values = codecs.decode(up.packet).to_dense()
    if spec.kind == "scale":
        values = values * np.float32(spec.scale)
    else:
        bad = np.float32("nan" if spec.kind == "nan" else "inf")
        values[rng.integers(0, values.size, size=max(1, values.size // 100))] = bad
    return messages.encode(_replace(up, packet=codecs.encode(values, codecs.CodecParams("fp32"))))


def _replace(up: ClientUpdate, **changes) -> ClientUpdate:
    return ClientUpdate(**{**up.__dict__, **changes})


@dataclass(frozen=True)
class Damage:
    spec: CorruptSpec
    round: int


class NodeFaults:
    """The faults of one life of one node, as its driver asks for them.

    ``plan`` is shared by every node of a run (emu) or given the crashes that
    already fired (a restarted real process); the delivery stream starts anew
    with each life, in both runtimes."""

    def __init__(self, faults: FaultSpec, seed: int, node: str, rank: int, plan: CrashPlan):
        self.spec, self.seed, self.node, self.rank, self.plan = faults, seed, node, rank, plan
        self.delivery = DeliveryFaults(faults, seed, stream=rank) if faults.perturbs_delivery else None
        # Does anything happen to what this node receives?
        self.on_receive = self.delivery is not None or faults.dropout_p > 0

    def crash_at(self, point: str, round_: int) -> Crash | None:
        return self.plan.trigger(self.node, point, round_)

    def outgoing(self, topic: str, data: bytes) -> tuple[bytes, Damage | None]:
        """``data`` as it leaves (a corrupt client damages its updates)."""
        if topic != CLIENT_UPDATE or not self.spec.corrupt:
            return data, None
        damaged, spec, round_ = damage(self.spec, self.node, data, self.seed)
        return damaged, (None if spec is None else Damage(spec, round_))

    def sits_out(self, msg: Message) -> int | None:
        """The round of a TrainCmd this client does not get (faults.dropout_p), else None."""
        if not self.spec.dropout_p or msg.topic != TRAIN_CMD:
            return None
        cmd = peek(msg.data)  # sealed or not; anything else is the client's to judge
        if isinstance(cmd, TrainCmd) and drops_round(self.seed, self.rank, cmd.round, self.spec.dropout_p):
            return cmd.round
        return None

    def copies(self, msg: Message) -> tuple[list[float], str | None]:
        """The extra delays of the copies of ``msg`` that arrive, and the fault's name if any
        (``message_lost``, ``partition``, ``duplicate``)."""
        if self.delivery is None:
            return [0.0], None
        copies = self.delivery.copies(msg.src, self.node, msg.received_at)
        if not copies:
            lost = "partition" if self.delivery.partitioned(msg.src, self.node, msg.received_at) else "message_lost"
            return [], lost
        return copies, ("duplicate" if len(copies) > 1 else None)
