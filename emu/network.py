"""The emulated network: a star of access links with max-min fair flows.

Topology.  Every node has one access link to a central switch (``emu.links.Link``:
an uplink and a downlink, a one-way latency and a packet-loss probability).  The
switch itself never limits anything.  A message from A to B is one *flow*
that crosses A's uplink and B's downlink.

Sharing.  Flows are a fluid.  Whenever the set of active flows changes (a flow
starts or ends), every flow's rate is recomputed, max-min fair over the links
the flows cross (``emu.fair_share``: progressive filling).  Between changes the
rates are constant, so the next completion is known exactly and a single timer
is armed for it; nothing is time-stepped.

Timing of one message of ``n`` payload bytes from A to B:

* the flow starts at ``send`` and ends when its wire bytes have gone through;
  the sender's event fires then ("done sending");
* the receiver's ``on_deliver`` runs ``latency(A) + latency(B)`` later.

Loss (reliable delivery, as over TCP or reliable DDS) -- the model's stated
simplification: the path loss is ``p = 1 - (1-loss(A)) (1-loss(B))``; the
message is ``ceil(n / mtu)`` packets, and ``lost ~ Binomial(packets, p)`` is
drawn once, at send time.  Each lost packet is sent once more as a full
``mtu`` (all packets lost costs exactly ``n`` more bytes) and retransmissions
are never lost themselves.  The extra bytes lengthen the flow, and delivery
is delayed by a further ``lost * 2 * (latency(A) + latency(B))``: every loss
costs one round trip to detect and resend, one after another.  The draws come
from the Network's own ``np.random.default_rng(seed)`` in event order, so a
run is deterministic for a seed.

Sites (optional, ``sites``/``wan``): nodes may be grouped into sites (data
centres).  A node's access link is then its site's LAN port; each site also
has a WAN attachment (up, down, latency).  A message between two sites
crosses four links -- the sender's uplink, its site's WAN uplink, the
receiving site's WAN downlink, the receiver's downlink -- and pays both
access latencies plus both WAN latencies; within a site it crosses the two
access links only.  Every link, WAN ports included (``emu.links.wan_port``),
is shared by the same max-min filling.  Without sites the model is the flat
star above, computed exactly as before (a flow's links are its two access ports).
``wan_bytes[site]`` counts the payload bytes of finished flows through each
site's WAN ("up", "down").

Multicast (``multicast``; ``network.delivery: multicast``): one copy per link, at the
slowest receiver's pace (``emu.multicast``).

Edge cases: a zero-byte message uses no bandwidth but still pays latency; a
message to oneself is delivered at once (zero delay, no links, no loss).

Real mode's framing and writer history (``emu.wire_model``; both off by default):
with ``framing="rtps"`` a flow carries the message's header bytes too (its frames,
RTPS fragments, UDP datagrams, IPv4 packets and their Ethernet headers), so it
takes the time real mode's does; ``bytes_sent``/``bytes_received`` stay payload,
``wire_bytes_sent`` counts the headers.  With ``send_window`` > 0 the event ``send``
returns succeeds once the flow has only the message's last writer-history group
left (``wire_model.tail_bytes``; a small message returns at once); a flow crosses the
network store and forward, the sender's side and then the receiver's (``emu.tandem``),
and the node's uplink is a FIFO (``emu.sender_fifo``): a later send from it starts once
every earlier flow from it has passed the sender's side, or ended if sooner (the flows of
one message to several receivers, one ``batch``, share it).  Between a message's writer
groups its flow waits for the group's acknowledgement, behind the queues of the way back
(``_send_ack``).  A flow slowed by its receiver's side waits in that side's queue, as in the
testbed's qdiscs, not in the sender's; a message waiting in the sender's FIFO returns when it starts.  Its FlowResult
is completed in place when the flow ends.

Failures: ``fail_node`` and ``restore_node`` (``emu.failures``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable

import numpy as np
import simpy

from . import tandem, wire_model
from .failures import Failures
from .sender_fifo import SenderFifo
from .fair_share import max_min_rates
from .flows import Delivery, Flow, MulticastFlow
from .links import FlowInfo, FlowResult, Link, NodeStats, link_from_spec, same_machine, wan_port
from .multicast import Multicasting

# The values moved to emu.links; importers still find them here.
__all__ = ["FlowInfo", "FlowResult", "Link", "Network", "NodeStats", "link_from_spec"]


class Network(SenderFifo, Multicasting, Failures):
    def __init__(self, env: simpy.Environment, links: dict[str, Link], seed: int = 0,
                 mtu: int = 1500, sites: dict[str, str] | None = None,
                 wan: dict[str, Link] | None = None, framing: str = "payload", send_window: int = 0,
                 machine_of: dict | None = None):
        """``sites`` maps a node to its site, ``wan`` a site to its WAN attachment (``loss`` unused);
        without them the network is the flat star.  ``framing``, ``send_window``: real mode's headers and
        writer history (``emu.wire_model``).  ``machine_of``: each node's machine where nodes share one
        (compute.machines: sites); a message within one crosses its loopback, which no link shapes."""
        if mtu <= 0:
            raise ValueError(f"mtu must be positive, got {mtu!r}")
        if framing not in wire_model.FRAMINGS:
            raise ValueError(f"framing must be one of {wire_model.FRAMINGS}, got {framing!r}")
        if send_window < 0:
            raise ValueError(f"send_window must be >= 0, got {send_window!r}")
        self.framing, self.send_window = framing, int(send_window)
        if framing != "payload":
            wire_model.wire_bytes(0, mtu, framing)  # an mtu too small for the headers fails here
        # send_window: each node's uplink a FIFO (emu.sender_fifo) -- its flows that still hold
        # it (until their bytes passed the sender's side, or their end if sooner), and the flows
        # waiting behind in send order, each with its batch token.
        self._holding: dict[str, set] = defaultdict(set)
        self._waiting: dict[str, list] = defaultdict(list)
        self._batch_on_wire: dict[str, object] = {}  # the batch token of a node's flows on the wire
        self.site_of, self.machine_of = dict(sites or {}), dict(machine_of or {})
        self.wan = dict(wan or {})
        for node, site in self.site_of.items():
            if node not in links or site not in self.wan:
                raise ValueError(f"node {node!r} in site {site!r}: unknown node or site without a WAN link")
        self.wan_bytes: dict[str, dict[str, int]] = {site: {"up": 0, "down": 0} for site in self.wan}
        self.env = env
        self.links = dict(links)
        self.mtu = mtu
        self.rng = np.random.default_rng(seed)
        self.stats: dict[str, NodeStats] = {node: NodeStats() for node in self.links}
        # Called with env.now after every rate recomputation (dashboards, tests).
        self.on_rates_changed: Callable[[float], None] | None = None
        # Capacity in bytes/s of each directed port, keyed (node, "up"|"down").
        self._capacity = {}
        for node, link in self.links.items():
            self._capacity[(node, "up")] = link.up_bps / 8
            self._capacity[(node, "down")] = link.down_bps / 8
        for site, link in self.wan.items():
            self._capacity[wan_port(site, "up")] = link.up_bps / 8
            self._capacity[wan_port(site, "down")] = link.down_bps / 8
        self._down_nodes: set[str] = set()
        self._active: dict[int, Flow] = {}     # insertion order keeps runs reproducible
        self._next_flow_id = 0
        self._synced_at = env.now               # when every flow's `remaining` was exact
        self._allocated_since_sync = False      # rates changed since then (see _sync)
        self._pending: dict[str, set[Delivery]] = defaultdict(set)  # by receiver
        # Bumped whenever rates may change, so an armed completion timer goes stale.
        self._generation = 0
        self._update_scheduled = False

    # -- public API -----------------------------------------------------------

    def send(self, src: str, dst: str, nbytes: int,
             on_deliver: Callable[[], None], batch: object = None, inline: bool = False) -> simpy.Event:
        """Start a flow of ``nbytes`` payload from src to dst.

        Returns an event that succeeds with a FlowResult when the sender is
        done (flow ended, aborted or dropped); ``on_deliver()`` runs at the
        receiver at delivery time unless the message is lost to a failure.
        With send_window, flows sent with the same ``batch`` token (one message
        to several receivers) share the sender's link; others queue behind
        (None: a batch of its own).  ``inline``: the message stays in DDS whatever the framing
        (framing "stream": a durable topic's message to everyone, which late joiners replay).
        """
        self._check_node(src)
        self._check_node(dst)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
        nbytes = int(nbytes)
        now = self.env.now
        event = self.env.event()
        self.stats[src].messages_sent += 1

        if src in self._down_nodes or dst in self._down_nodes:
            self.stats[src].messages_lost_to_failure += 1
            event.succeed(FlowResult(src, dst, nbytes, now, now, None, 0, 0, aborted=True))
            return event

        if same_machine(self.machine_of, src, dst):
            # Loopback, to itself or a node of its machine: no link, loss or latency (its time is both
            # ends' CPU, emu.world).
            self._flow_done(src, dst, nbytes, 0, now, 0, event, on_deliver, delay=0.0)
            return event

        lost = self._draw_lost_packets(src, dst, nbytes)
        framing = "rtps" if inline and self.framing == "stream" else self.framing
        total = self._wire(nbytes, framing) + min(lost * self.mtu, nbytes)
        if total == 0 and not self.send_window:
            self._flow_done(src, dst, nbytes, 0, now, 0, event, on_deliver,
                            delay=self._path_latency(src, dst))
            return event

        self._sync()
        flow = Flow(src, dst, nbytes, total, now, lost, event, on_deliver, wan=self._wan_ports(src, dst),
                     release=self._release_at(nbytes, total, framing),
                     bounds=wire_model.group_bounds(nbytes, self.send_window, self.mtu, framing))
        self._start_or_wait(flow, batch)
        return event

    def _wire(self, nbytes: int, framing: str) -> int:
        """Bytes on the wire for ``nbytes`` of payload (the framing's headers included)."""
        return nbytes if framing == "payload" else wire_model.wire_bytes(nbytes, self.mtu, framing)

    def _release_at(self, nbytes: int, total: int, framing: str) -> float:
        """The wire bytes still to go when a writer with send_window returns (0: none).  On the
        stream (framing "stream") a destination may have the window unacknowledged, a frame at a
        time (real.stream_out): the send returns once its last window's worth is on the way."""
        if not self.send_window or nbytes == 0:
            return 0.0
        if framing == "stream" and nbytes >= wire_model.STREAM_MIN_BYTES:
            return total * min(nbytes, max(self.send_window, wire_model.STREAM_FRAME_BYTES)) / nbytes
        return total * wire_model.tail_bytes(nbytes, self.send_window) / nbytes

    def active_flows(self) -> list[FlowInfo]:
        """Every flow on the wire now, with its remaining bytes as of env.now."""
        elapsed = self.env.now - self._synced_at
        return [FlowInfo(f.src, f.dst, f.total, max(0.0, f.remaining - f.rate * elapsed), f.rate)
                for f in self._active.values()]

    # -- timing of one message ------------------------------------------------

    def _path_latency(self, src: str, dst: str) -> float:
        latency = self.links[src].latency_s + self.links[dst].latency_s
        a, b = self.site_of.get(src), self.site_of.get(dst)
        if a != b and a is not None and b is not None:
            latency += self.wan[a].latency_s + self.wan[b].latency_s
        return latency

    def _wan_ports(self, src: str, dst: str) -> tuple:
        """The WAN ports a message from src to dst crosses (none within a site, or without sites)."""
        a, b = self.site_of.get(src), self.site_of.get(dst)
        if a == b or a is None or b is None:
            return ()
        return (wan_port(a, "up"), wan_port(b, "down"))

    def crosses_wan(self, src: str, dst: str) -> bool:
        return bool(self._wan_ports(src, dst))

    def _draw_lost_packets(self, src: str, dst: str, nbytes: int) -> int:
        p = 1 - (1 - self.links[src].loss) * (1 - self.links[dst].loss)
        packets = -(-nbytes // self.mtu)
        if p == 0 or packets == 0:
            return 0    # no draw: a lossless path must not shift the RNG stream
        return int(self.rng.binomial(packets, p))

    def _flow_done(self, src, dst, nbytes, wire, start, lost, event, on_deliver, delay, released=None):
        """The sender is done: fire its event and put the message in propagation."""
        now = self.env.now
        stats = self.stats[src]
        stats.bytes_sent += nbytes
        stats.wire_bytes_sent += wire
        if self.site_of and self.crosses_wan(src, dst):
            self.wan_bytes[self.site_of[src]]["up"] += nbytes
            self.wan_bytes[self.site_of[dst]]["down"] += nbytes
        result = FlowResult(src, dst, nbytes, start, now, now + delay, lost, wire)
        if released is not None:  # the sender's event fired earlier with this object (send_window)
            released.end, released.delivered_at, released.wire_bytes = now, now + delay, wire
            result = released
        delivery = Delivery(result, on_deliver)
        self._pending[dst].add(delivery)
        timer = self.env.timeout(delay)
        timer.callbacks.append(lambda _ev: self._deliver(delivery))
        if released is None:
            event.succeed(result)

    def _deliver(self, delivery: Delivery) -> None:
        if delivery.cancelled:
            return
        result = delivery.result
        self._pending[result.dst].discard(delivery)
        stats = self.stats[result.dst]
        stats.messages_delivered += 1
        stats.bytes_received += result.nbytes
        delivery.on_deliver()

    # -- the fluid model ------------------------------------------------------

    def _sync(self) -> None:
        """Bring every flow's `remaining` to env.now and finish the flows that are done.

        Callers reallocate afterwards: a finished flow frees capacity.
        """
        now = self.env.now
        elapsed = now - self._synced_at
        self._synced_at = now
        if not self._active:
            return
        if elapsed == 0 and not self._allocated_since_sync:
            # Nothing moved since the last sync in this instant, and no rate
            # changed: the same flows would be found done. This keeps a burst
            # of W·(W-1) sends in one instant linear instead of quadratic.
            return
        self._allocated_since_sync = False
        # A flow due "now" can be left with float dust (elapsed is rounded to
        # the resolution of env.now); anything within that slack is done.
        slack = 4 * math.ulp(max(now, 1.0))
        finished, passed, stopped = [], [], False
        for flow_id, flow in self._active.items():
            if elapsed > 0:
                flow.remaining -= flow.rate * elapsed
            if self.send_window:
                ended, at_group_end = tandem.advance(flow, elapsed, slack)
                if ended:
                    passed.append(flow)
                stopped |= at_group_end
            if flow.remaining <= flow.rate * slack + 1e-12 * flow.total:
                finished.append(flow_id)
            elif (flow.release and flow.result is None and not flow.bounds
                  and flow.remaining <= flow.release + flow.rate * slack):
                self._released(flow)   # (a flow of several groups returns as its last one starts)
        for flow_id in finished:
            f = self._active.pop(flow_id)
            if isinstance(f, MulticastFlow):
                self._multicast_done(f)
            else:
                self._flow_done(f.src, f.dst, f.nbytes, f.total, f.start, f.lost, f.event,
                                f.on_deliver,
                                delay=(1 + 2 * f.lost) * self._path_latency(f.src, f.dst), released=f.result)
            self._flow_left(f)
        for f in passed:
            self._passed_sender(f)
        if passed or stopped:   # their second stage goes on alone: its rate is no longer the first's
            self._schedule_update()
        for f in self._active.values():
            if f.bounds and not f.acking and tandem.awaiting_ack(f):
                self._send_ack(f)

    # -- a writer's groups (emu.tandem) -----------------------------------------

    def _send_ack(self, flow) -> None:
        """The flow's group arrived: its acknowledgement comes back after the path's round trip and
        whatever waits ahead of it on the way back."""
        flow.acking = True
        back = ((flow.dst, "up"), *self._wan_ports(flow.dst, flow.src), (flow.src, "down"))
        delay = (2 * self._path_latency(flow.src, flow.dst)
                 + tandem.ack_delay(list(self._active.values()), self._capacity, back))
        self.env.timeout(delay).callbacks.append(lambda _ev: self._acked(flow))

    def _acked(self, flow) -> None:
        """The writer has its group acknowledged: the next group goes out (and with the last one, the
        send returns)."""
        if not any(f is flow for f in self._active.values()):
            return   # aborted meanwhile (a failure)
        self._sync()
        flow.acking = False
        flow.group += 1
        if flow.group == len(flow.bounds) and flow.release and flow.result is None:
            self._released(flow)
        self._schedule_update()

    def _schedule_update(self) -> None:
        """Recompute rates once, later in this instant, for any number of changes now."""
        self._generation += 1      # the armed timer assumed the old rates
        if self._update_scheduled:
            return
        self._update_scheduled = True
        self.env.timeout(0).callbacks.append(self._on_update)

    def _on_update(self, _event) -> None:
        self._update_scheduled = False
        self._update()

    def _on_timer(self, generation: int, _event) -> None:
        if generation == self._generation:
            self._update()

    def _update(self) -> None:
        self._sync()
        self._allocate()
        self._generation += 1
        if self.on_rates_changed is not None:
            self.on_rates_changed(self.env.now)
        self._arm_timer()

    def _allocate(self) -> None:
        """Every active flow's max-min fair rate over the ports in use (emu.fair_share)."""
        self._allocated_since_sync = True
        flows = list(self._active.values())
        if self.send_window:   # store and forward: the sender's side, then the receiver's (emu.tandem)
            tandem.allocate(flows, self._capacity)
            return
        for flow, rate in zip(flows, max_min_rates([flow.ports for flow in flows], self._capacity)):
            flow.rate = rate

    def _arm_timer(self) -> None:
        """One timeout for the earliest completion; later changes make it stale."""
        time_left = min((f.remaining / f.rate for f in self._active.values() if f.rate > 0),
                        default=None)
        if self.send_window:  # a writer's return (its flow down to the last group) is an instant too
            release_left = min(((f.remaining - f.release) / f.rate for f in self._active.values()
                                if f.rate > 0 and f.release and f.result is None and not f.bounds), default=None)
            if release_left is not None:
                time_left = release_left if time_left is None else min(time_left, release_left)
            # a first stage's end or a queue run dry changes the rates (emu.tandem)
            changes = [t for t in map(tandem.next_change, self._active.values()) if t is not None]
            if changes:
                time_left = min(changes) if time_left is None else min(time_left, *changes)
        if time_left is None:
            return
        generation = self._generation
        self.env.timeout(max(time_left, 0.0)).callbacks.append(
            lambda ev: self._on_timer(generation, ev))

    def _check_node(self, node: str) -> None:
        if node not in self.links:
            raise KeyError(f"unknown node {node!r}")

