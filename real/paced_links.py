"""The scenario's links on one machine: what `real launch` adds to loopback so a message takes emu's time.

Over loopback DDS moves a message in about a millisecond, whatever the scenario
says of its links.  A round that closes at its timeout with whoever arrived
then takes a straggler that emu's network made late: emu's fl_straggler gives
the model 67 ms and an update 23-50 ms on the way, and four of client4's
arrivals land within 55 ms of the 0.8 s deadline.  So under a launch's time
scale every rank paces its own traffic by the scenario's links, stretched by
the scale, as it paces its training (real.primitives):

- **sending**: the node's uplink is a FIFO.  A message of ``n`` bytes to ``k``
  receivers (``k`` copies; one under ``network.delivery: multicast``) holds it
  for the longest of ``k n / up(src)`` and ``n / down(dst)`` for each receiver
  (and each site's WAN, between sites).  The message is written when its last
  bit is through, which is when emu's send returns ("done sending").
- **receiving**: a message is handed to the role the path's latency after it
  was written (``latency(src) + latency(dst)``, plus both WANs' between sites):
  when emu delivers it.

On the testbed's machines (``real launch --machines``), tc shapes the rates; where the kernel has
no netem to delay packets, only the receiving half runs (``rates=False``): a message is held for
the path's latency, and leaves at once.

What emu's max-min fluid model has and this has not: a receiver's downlink
shared among several senders (a FIFO per sender cannot see the others), loss,
and the rtps framing's headers.  For the shipped FL scenarios these move a
message by well under a millisecond of scenario time.  The ``sent_at`` a
receiver reads is the sender's clock read on the receiver's (real.clock_sync),
so pacing holds between machines whose clocks disagree.
"""

from __future__ import annotations

from dtemu.core.scenario import Scenario


class PacedLinks:
    """One node's view of the scenario's network, in seconds of its runtime's clock, times ``pace``."""

    def __init__(self, scenario: Scenario, node: str, pace: float, rates: bool = True):
        self.node = node
        self.rates = rates
        self.pace = pace
        self.multicast = scenario.network.delivery == "multicast"
        self._links = {name: scenario.link(name) for name in scenario.node_names}
        self._site = scenario.site_of
        self._wan = {name: site.wan for name, site in scenario.network.sites.items()}
        self._uplink_free = 0.0  # when the FIFO uplink has sent what it holds

    def send_done(self, now: float, nbytes: int, receivers: list[str]) -> float:
        """When a message of ``nbytes`` to ``receivers``, sent at ``now``, has left this node."""
        others = [r for r in receivers if r != self.node and r in self._links]
        if not others or not self.rates:
            return now  # to oneself, or to no one: at once, as in emu (or the network's rates are real)
        copies = 1 if self.multicast else len(others)
        bits = 8.0 * nbytes
        up = self._links[self.node].up_mbps
        seconds = max([copies * bits / (up * 1e6)] + [bits / (self._bottleneck(r) * 1e6) for r in others])
        start = max(now, self._uplink_free)
        self._uplink_free = start + self.pace * seconds
        return self._uplink_free

    def due(self, src: str, sent_at: float, arrived_at: float | None = None) -> float:
        """When a message ``src`` wrote at ``sent_at`` (and the network brought at ``arrived_at``)
        reaches this node's role.  Paced rates: the sender wrote it once its bits were through, so
        the latency runs from ``sent_at``.  The network's own rates (``rates=False``): the bits took
        the real link's time, and the latency runs from their arrival."""
        start = sent_at if self.rates or arrived_at is None else arrived_at
        if src == self.node or src not in self._links:
            return start
        return start + self.pace * self._latency_s(src)

    def _wans(self, src: str, dst: str) -> tuple:
        """The WAN attachments a message from ``src`` to ``dst`` crosses: its site's and the other's, or none."""
        a, b = self._site.get(src), self._site.get(dst)
        return (self._wan[a], self._wan[b]) if a != b and a in self._wan and b in self._wan else ()

    def _bottleneck(self, dst: str) -> float:
        """Mbit/s of the narrowest link past the sender's uplink on the way to ``dst``."""
        wans = self._wans(self.node, dst)
        return min([self._links[dst].down_mbps] + ([wans[0].up_mbps, wans[1].down_mbps] if wans else []))

    def _latency_s(self, src: str) -> float:
        ms = self._links[src].latency_ms + self._links[self.node].latency_ms
        return (ms + sum(w.latency_ms for w in self._wans(src, self.node))) / 1e3
