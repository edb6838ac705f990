"""The emulated network's flows in flight (emu.network): a message on the wire to one receiver
(``Flow``) or to many at once (``MulticastFlow``), and a message in propagation (``Delivery``)."""

from __future__ import annotations


class Flow:
    """An active flow; ``remaining`` is exact as of ``Network._synced_at``."""

    __slots__ = ("src", "dst", "ports", "nbytes", "total", "remaining", "rate",
                 "start", "lost", "event", "on_deliver", "release", "result", "passed", "rate_up",
                 "bounds", "group", "acking")

    def __init__(self, src, dst, nbytes, total, start, lost, event, on_deliver, wan=(), release=0.0, bounds=()):
        self.src, self.dst = src, dst
        # Every port (link direction) the flow crosses; flat: the two access ports.
        self.ports = ((src, "up"), *wan, (dst, "down"))
        self.nbytes, self.total, self.remaining = nbytes, total, float(total)
        self.rate = 0.0
        self.start, self.lost = start, lost
        self.event, self.on_deliver = event, on_deliver
        # Writer history: the sender's event fires when `remaining` is down to `release`
        # (0: at the end); `result` is the FlowResult it fired with, completed at the end.
        self.release, self.result = release, None
        # send_window (emu.tandem): the bytes that passed the sender's side, and at what rate.
        self.passed, self.rate_up = 0.0, 0.0
        # ... and where each group of its writer's frames but the last ends (wire_model.group_bounds):
        # the group it is in, and whether its acknowledgement is on the way back.
        self.bounds, self.group, self.acking = tuple(bounds), 0, False


class MulticastFlow:
    """One message to many receivers, sent once: it crosses the sender's uplink (and each
    WAN port) once and every receiver's downlink once, at one rate for all (the slowest
    receiver's, as a reliable multicast is paced); each member is (dst, lost, on_deliver)."""

    __slots__ = ("src", "dst", "ports", "nbytes", "total", "remaining", "rate", "start", "event", "members",
                 "lost", "release", "result", "passed", "rate_up", "bounds", "group", "acking")

    def __init__(self, src, members, nbytes, total, start, event, wan=(), release=0.0):
        self.src, self.dst, self.members = src, "*", list(members)
        self.ports = ((src, "up"), *wan, *((dst, "down") for dst, _, _ in self.members))
        self.nbytes, self.total, self.remaining = nbytes, total, float(total)
        self.rate = 0.0
        self.start, self.event = start, event
        self.lost = 0  # per member (an aborted multicast reports none)
        self.release, self.result = release, None  # as Flow's (result: the members' list)
        self.passed, self.rate_up = 0.0, 0.0       # as Flow's
        # Acknowledged by every member: not modelled, so no groups (it goes out as one).
        self.bounds, self.group, self.acking = (), 0, False


class Delivery:
    """A message in propagation; ``cancelled`` stops it when the receiver fails."""

    __slots__ = ("result", "on_deliver", "cancelled")

    def __init__(self, result, on_deliver):
        self.result, self.on_deliver, self.cancelled = result, on_deliver, False
