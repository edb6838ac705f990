"""A node of the emulated network going down and coming back (``Failures``, a part of
``emu.network.Network``, whose state it uses).

``fail_node`` aborts every active flow from or to the node (the bytes already sent stay counted
as wire bytes; a multicast goes on to its other receivers), cancels deliveries still pending *to*
it, and drops every later send from or to it until ``restore_node``.  Messages whose flow already
ended are in the network, so a sender failing afterwards does not stop their delivery.
"""

from __future__ import annotations

from .flows import MulticastFlow
from .links import FlowResult


class Failures:
    def fail_node(self, node: str) -> None:
        """The node went offline: abort its flows, cancel deliveries to it."""
        self._check_node(node)
        if node in self._down_nodes:
            return
        self._down_nodes.add(node)
        # Flows finishing exactly now are finished first, not aborted.
        self._sync()
        now = self.env.now
        for flow_id, flow in list(self._active.items()):
            if isinstance(flow, MulticastFlow) and flow.src != node:
                kept = [m for m in flow.members if m[0] != node]
                if len(kept) < len(flow.members):  # the others go on without it
                    self.stats[flow.src].messages_lost_to_failure += 1
                    flow.members = kept
                    flow.ports = tuple(p for p in flow.ports if p != (node, "down"))
                if kept:
                    continue
            elif flow.src != node and flow.dst != node:
                continue
            del self._active[flow_id]
            wire = round(flow.total - flow.remaining)
            stats = self.stats[flow.src]
            stats.wire_bytes_sent += wire
            stats.messages_lost_to_failure += 1
            self._abort(flow, wire, now)
            self._let_go(flow)
        self._drop_waiting(node, now)
        for delivery in self._pending.pop(node, ()):
            delivery.cancelled = True
            delivery.result.delivered_at = None
            self.stats[delivery.result.src].messages_lost_to_failure += 1
        self._schedule_update()

    def _drop_waiting(self, node: str, now: float) -> None:
        """send_window: flows from or to a failed node that were waiting for the wire never start."""
        for src, queue in self._waiting.items():
            kept = []
            for batch, flow in queue:
                if isinstance(flow, MulticastFlow) and src != node:
                    members = [m for m in flow.members if m[0] != node]
                    if len(members) < len(flow.members):
                        self.stats[src].messages_lost_to_failure += 1
                        flow.members = members
                        flow.ports = tuple(p for p in flow.ports if p != (node, "down"))
                    if members:
                        kept.append((batch, flow))
                        continue
                elif src != node and flow.dst != node:
                    kept.append((batch, flow))
                    continue
                else:
                    self.stats[src].messages_lost_to_failure += 1
                self._abort(flow, 0, now)
            queue[:] = kept
        for src in list(self._waiting):  # a sender whose flows on the wire were all aborted goes on
            self._start_next(src)

    def _abort(self, flow, wire: int, now: float) -> None:
        """The flow will never end: its sender's event fires (or its released result says so)."""
        result = FlowResult(flow.src, flow.dst, flow.nbytes, flow.start, now, None, flow.lost, wire, aborted=True)
        if flow.result is None:
            flow.event.succeed(result)
        elif isinstance(flow.result, list):
            for r in flow.result:
                r.end, r.aborted = now, True
        else:
            flow.result.end, flow.result.wire_bytes, flow.result.aborted = now, wire, True

    def restore_node(self, node: str) -> None:
        """The node is back: sends from and to it go through again."""
        self._check_node(node)
        self._down_nodes.discard(node)

    def is_up(self, node: str) -> bool:
        self._check_node(node)
        return node not in self._down_nodes
