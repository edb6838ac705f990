"""The network model's values: links, ports and what a message or node reports.

A ``Link`` is one node's access link to the switch (or a site's WAN attachment):
an uplink and a downlink in bits/s, a one-way latency and a packet-loss
probability.  Each direction of a link is a *port*, the unit that flows share:
a node's access ports are keyed ``(node, "up"|"down")``, a site's WAN ports
``wan_port(site, "up"|"down")``.  ``FlowResult``, ``NodeStats`` and ``FlowInfo``
are what ``emu.network.Network`` reports about one message, one node and one
active flow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class Link:
    """One node's access link to the switch."""

    up_bps: float
    down_bps: float
    latency_s: float = 0.0
    loss: float = 0.0

    def __post_init__(self):
        for name in ("up_bps", "down_bps"):
            bps = getattr(self, name)
            # Zero capacity would stall flows forever; infinity breaks the rate arithmetic.
            if not (0 < bps < math.inf):
                raise ValueError(f"{name} must be positive and finite, got {bps!r}")
        if not (0 <= self.latency_s < math.inf):
            raise ValueError(f"latency_s must be >= 0 and finite, got {self.latency_s!r}")
        # loss == 1 would mean a message never gets through.
        if not (0 <= self.loss < 1):
            raise ValueError(f"loss must be in [0, 1), got {self.loss!r}")


def link_from_spec(up_mbps: float, down_mbps: float, latency_ms: float = 0.0,
                   loss: float = 0.0) -> Link:
    """A Link from scenario units: Mbit/s (1e6 bit/s) and milliseconds."""
    return Link(up_bps=up_mbps * 1e6, down_bps=down_mbps * 1e6,
                latency_s=latency_ms / 1e3, loss=loss)


def same_machine(machine_of: dict, a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are one node, or two nodes of one machine (``machine_of``: node -> its
    machine, where nodes share one): what passes between them crosses its loopback, on no link."""
    return a == b or (a in machine_of and machine_of.get(b) is machine_of[a])


def wan_port(site: str, direction: str) -> tuple[str, str]:
    """A site's WAN port; the "wan:" prefix keeps it apart from access ports (node, "up"|"down")."""
    return (f"wan:{site}", direction)


@dataclass
class FlowResult:
    """What happened to one message; the value of the event ``send`` returns.

    ``delivered_at`` is the delivery time scheduled when the flow ended; it is
    None when the message will never be delivered (aborted, dropped, or its
    delivery cancelled later because the receiver failed -- this object is
    updated in place then).
    """

    src: str
    dst: str
    nbytes: int
    start: float
    end: float
    delivered_at: float | None
    lost_packets: int
    wire_bytes: int
    aborted: bool = False
    # With a writer history (send_window): the sender's event fired at ``released_at``, before
    # the flow ended; ``end``, ``delivered_at`` and ``wire_bytes`` are filled in when it does.
    released_at: float | None = None


@dataclass
class NodeStats:
    """Per-node counters.

    Sender side: ``messages_sent`` counts every send (dropped ones too),
    ``bytes_sent`` the payload of flows that finished, ``wire_bytes_sent``
    everything put on the wire (retransmits and aborted partial flows too),
    ``messages_lost_to_failure`` the sent messages that will never arrive.
    Receiver side: ``messages_delivered`` and ``bytes_received`` (payload).
    """

    bytes_sent: int = 0
    bytes_received: int = 0
    wire_bytes_sent: int = 0
    messages_sent: int = 0
    messages_delivered: int = 0
    messages_lost_to_failure: int = 0


class FlowInfo(NamedTuple):
    """A snapshot of one active flow, for dashboards and tests."""

    src: str
    dst: str
    total: int          # wire bytes, retransmits included
    remaining: float    # wire bytes still to go
    rate: float         # bytes/s
