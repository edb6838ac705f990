"""Max-min fair rates for flows sharing ports, by progressive filling.

Each flow crosses some ports (a port: one direction of a link, with a capacity
in bytes/s).  The port whose capacity left divided by its unfixed flows is the
smallest fixes those flows at that share; its share is taken from the capacity
of their other ports, and so on until every flow has a rate.  The result is
max-min fair: no flow could go faster without slowing one that is no faster.

The arithmetic is the emulator's pinned arithmetic: ports are visited in the
order flows first name them and flows in the order given, so a change here
moves the shipped scenarios' virtual times.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence


def max_min_rates(flow_ports: Sequence[Sequence[Hashable]],
                  capacity: Mapping[Hashable, float]) -> list[float]:
    """The rate of each flow, given each flow's ports and each port's capacity.

    Fixing flows at the smallest share can only raise other ports' shares, so
    a heap holding one possibly outdated (too low) share per port finds the
    next bottleneck: a popped port whose share has grown goes back in with the
    new value.
    """
    rates = [-1.0] * len(flow_ports)  # -1: not yet fixed
    flows_on_port = defaultdict(list)
    for flow, ports in enumerate(flow_ports):
        for port in ports:
            flows_on_port[port].append(flow)
    capacity_left = {port: capacity[port] for port in flows_on_port}
    unfixed = {port: len(flows) for port, flows in flows_on_port.items()}
    heap = [(capacity_left[port] / count, port) for port, count in unfixed.items()]
    heapq.heapify(heap)
    while heap:
        share, port = heapq.heappop(heap)
        count = unfixed[port]
        if count == 0:
            continue              # all its flows were fixed at other bottlenecks
        current = max(capacity_left[port], 0.0) / count
        if current > share:
            heapq.heappush(heap, (current, port))
            continue
        for flow in flows_on_port[port]:
            if rates[flow] >= 0:
                continue
            rates[flow] = current
            for p in flow_ports[flow]:
                capacity_left[p] -= current
                unfixed[p] -= 1
    return rates
