"""The ``network`` section of a scenario: each node's access link, the sites and how messages are
framed and queued (emu.network models them; real mode's network is the one it runs on)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dtemu.core.geo.spec import SiteSpec
from dtemu.core.schema import check, non_negative, positive, probability


@dataclass(frozen=True)
class LinkSpec:
    up_mbps: float = field(default=1000.0, metadata=check(positive))
    down_mbps: float = field(default=1000.0, metadata=check(positive))
    latency_ms: float = field(default=0.5, metadata=check(non_negative))
    loss: float = field(default=0.0, metadata=check(probability))


@dataclass(frozen=True)
class LinkOverride:
    up_mbps: float | None = field(default=None, metadata=check(positive))
    down_mbps: float | None = field(default=None, metadata=check(positive))
    latency_ms: float | None = field(default=None, metadata=check(non_negative))
    loss: float | None = field(default=None, metadata=check(probability))


@dataclass(frozen=True)
class NetworkSpec:
    default: LinkSpec = field(default_factory=LinkSpec)
    nodes: dict[str, LinkOverride] = field(default_factory=dict)
    mtu: int = field(default=1500, metadata=check(positive))
    # A message to many receivers (the model to every client): one flow per receiver
    # (unicast), or one copy per link (multicast, as DDS over IP multicast on a LAN).
    delivery: Literal["unicast", "multicast"] = "unicast"
    # Data centres (core.geo.spec): each a LAN and a WAN attachment; empty: the flat star.
    sites: dict[str, SiteSpec] = field(default_factory=dict)
    # The central site (geo: master and global PS); None: the first of network.sites.
    central: str | None = None
    # Emu's time on the wire as real mode's DDS transport spends it (emu/wire_model.py); byte
    # counts in summaries stay payload.  framing "rtps": a flow also carries the frames', RTPS
    # fragments', UDP, IPv4 and Ethernet headers ("payload": the payload only); "stream": a message
    # of 64 KiB or more goes on real mode's TCP stream beside DDS instead (TCP segments' headers).
    framing: Literal["payload", "rtps", "stream"] = "payload"
    # A sender's writer history in bytes (real mode: DDS WhcHigh, 2 MiB): a send returns once
    # the message's last history group is all that is left on the wire, and later sends from
    # that node queue behind it (the link is a FIFO).  0: a send returns when its flows end.
    send_window_bytes: int = field(default=0, metadata=check(non_negative))
