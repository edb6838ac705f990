"""One message to many receivers, as IP multicast on the switch sends it (``network.delivery:
multicast``): one flow that crosses the sender's uplink once, each WAN port once, and every
receiver's downlink, at one rate (the smallest fair share of any of its links: a reliable
multicast goes at its slowest reader's pace); each receiver gets it at the flow's end plus its
own path latency.  The sender counts its bytes once; every receiver counts them.

``Multicasting`` is a part of ``emu.network.Network``, whose state and fluid model it uses.
"""

from __future__ import annotations

import functools
from typing import Callable

import simpy

from .flows import Delivery, MulticastFlow
from .links import FlowResult, same_machine


class Multicasting:
    def multicast(self, src: str, dsts: list[str], nbytes: int,
                  on_deliver: Callable[[str], None]) -> simpy.Event:
        """Send ``nbytes`` from src to every node of ``dsts`` at once, as IP multicast on the
        switch does: one copy per link (``MulticastFlow``).  ``on_deliver(dst)`` runs at each
        receiver at its delivery time; the event succeeds with the list of FlowResults when
        the sender is done.  Loss: each receiver's lost packets are drawn as for a unicast
        (in ``dsts`` order); their repairs are multicast too, so the flow carries the most
        any receiver lost, and each receiver pays a round trip per packet it lost."""
        self._check_node(src)
        for dst in dsts:
            self._check_node(dst)
        nbytes = int(nbytes)
        now = self.env.now
        event = self.env.event()
        self.stats[src].messages_sent += 1
        members, lost_most = [], 0
        for dst in dsts:
            if src in self._down_nodes or dst in self._down_nodes or dst == src:
                self.stats[src].messages_lost_to_failure += dst != src
                continue
            if same_machine(self.machine_of, src, dst):   # the multicast loops back in its kernel, on no link
                self._flow_done(src, dst, nbytes, 0, now, 0, self.env.event(), functools.partial(on_deliver, dst), 0.0)
                continue
            lost = self._draw_lost_packets(src, dst, nbytes)
            lost_most = max(lost_most, lost)
            members.append((dst, lost, functools.partial(on_deliver, dst)))
        # a multicast message to everyone stays in DDS whatever the framing (real.sending)
        framing = "rtps" if self.framing == "stream" else self.framing
        total = self._wire(nbytes, framing) + min(lost_most * self.mtu, nbytes)
        if not members or (total == 0 and not self.send_window):
            results = [self._member_done(src, m, nbytes, 0, now) for m in members]
            event.succeed(results)
            return event
        wan = []
        for dst, _, _ in members:
            wan += [p for p in self._wan_ports(src, dst) if p not in wan]
        self._sync()
        self._start_or_wait(MulticastFlow(src, members, nbytes, total, now, event, wan,
                                       release=self._release_at(nbytes, total, framing)))  # a batch of its own
        return event

    def _member_done(self, src, member, nbytes, start, now) -> FlowResult:
        """One receiver of a multicast: its message goes into propagation."""
        dst, lost, on_deliver = member
        delay = (1 + 2 * lost) * self._path_latency(src, dst)
        result = FlowResult(src, dst, nbytes, start, now, now + delay, lost, 0)
        delivery = Delivery(result, on_deliver)
        self._pending[dst].add(delivery)
        self.env.timeout(delay).callbacks.append(lambda _ev: self._deliver(delivery))
        return result

    def _multicast_done(self, f: MulticastFlow) -> None:
        now = self.env.now
        stats = self.stats[f.src]
        stats.bytes_sent += f.nbytes  # once: the point of multicast
        stats.wire_bytes_sent += f.total
        for name, direction in f.ports:   # each WAN port it crossed, once
            if isinstance(name, str) and name.startswith("wan:"):
                self.wan_bytes[name[4:]][direction] += f.nbytes
        results = [self._member_done(f.src, m, f.nbytes, f.start, now) for m in f.members]
        if f.result is None:
            f.event.succeed(results)
        else:  # released earlier (send_window): the list it fired with, completed in place
            released_at = f.result[0].released_at   # (one instant for every member)
            for result in results:
                result.released_at = released_at
            f.result[:] = results
