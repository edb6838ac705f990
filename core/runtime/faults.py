"""Faults of a scenario, decided once for both runtimes (no I/O, no clock).

The runtimes carry faults out; this module only decides them, from the
scenario and its seed, so that emu and real mode inject the same thing:

- ``CrashPlan``: crashes at protocol points (``faults.crashes``).  A runtime
  hands it every event a role emits; it answers which crash, if any, that
  event triggers and how it lands (``NOW``: the node dies before its next
  step; ``IN_COMPUTE`` / ``IN_SEND``: halfway through the next training job /
  upload; ``AFTER_SEND``: as soon as the next message has gone out).  Each
  crash fires once, even if the restarted node goes through the same point.
- ``DeliveryFaults``: per delivered message, lost / duplicated / held back,
  and partitions; draws come from its own seeded stream in delivery order.
- ``corrupt_update``: a client update damaged as ``faults.corrupt`` says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dtemu.core.wire import auth
from dtemu.core.compression import codecs
from dtemu.core.wire import messages
from dtemu.core.errors import DecodeError
from dtemu.core.wire.messages import ClientUpdate
from dtemu.core.scenario import CrashSpec, CorruptSpec, FaultSpec

NOW, IN_COMPUTE, IN_SEND, AFTER_SEND = "now", "in_compute", "in_send", "after_send"

# (the event that arms the crash, how it lands), by crash point
_TRIGGERS = {
    "before_train": ("train_start", NOW),
    "during_train": ("train_start", IN_COMPUTE),
    "mid_upload": ("upload_start", IN_SEND),
    "after_upload": ("upload_done", NOW),
    "mid_round": ("round_start", AFTER_SEND),
    "before_checkpoint": ("aggregated", NOW),
    "after_checkpoint": ("checkpoint", NOW),
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

    def trigger(self, node: str, kind: str, fields: dict) -> Crash | None:
        """The crash that event ``kind`` of ``node`` sets off, marked as fired."""
        for i, spec in enumerate(self.crashes):
            event, landing = _TRIGGERS[spec.at]
            if i in self.fired or spec.node != node or kind != event or fields.get("round") != spec.round:
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
