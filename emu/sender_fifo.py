"""Each sender's messages in order on its side of the network (``SenderFifo``, a part of
``emu.network.Network``, whose state it uses), with ``send_window``: real mode's writer history.

A sender's flows go out one message (one ``batch``: its flows to several receivers share the
link) after another.  A message holds its sender until its bytes have passed the sender's side
(its own link, and its site's WAN uplink where it crosses it: emu.tandem's first stage), or
until it ends if sooner; then the next one starts.  Where the receiver's side is slower, the rest
waits in that side's queue, as in the testbed's qdiscs, and not in the sender's: a DDS writer's
next sample goes out behind it.  (Holding the sender until the receiver had it all made a DDP
step with one member 0.024 s late take +0.17 s in emu, and +0 on the testbed: notebook entry 35.)

Without ``send_window`` every flow starts at once and shares the links (max-min fair).  Real
mode's stream keeps the same order (real.stream_out: a frame to one peer waits while a message of
several frames to another is unacknowledged), so its flows queue here as DDS's do.
"""

from __future__ import annotations

from .flows import MulticastFlow
from .links import FlowResult


class SenderFifo:
    def _start_or_wait(self, flow, batch: object = None) -> None:
        """Put a flow on the wire, or (send_window) behind the earlier flows of its sender."""
        batch = object() if batch is None else batch
        queue = self._waiting[flow.src]
        if self.send_window and self._holding[flow.src] and self._batch_on_wire.get(flow.src) is not batch:
            queue.append((batch, flow))
            return
        if self.send_window and queue and queue[-1][0] is batch:  # its batch is waiting: with it
            queue.append((batch, flow))
            return
        self._batch_on_wire[flow.src] = batch
        self._activate(flow)

    def _activate(self, flow) -> None:
        self._active[self._next_flow_id] = flow
        self._next_flow_id += 1
        # send_window: it holds its sender until its bytes have passed the sender's side
        # (emu.tandem's first stage: Network._sync lets it go), or until it ends if sooner.
        self._holding[flow.src].add(flow)
        self._schedule_update()

    def _let_go(self, flow) -> bool:
        """``flow`` no longer holds its sender's link (True if it did until now)."""
        if flow not in self._holding[flow.src]:
            return False
        self._holding[flow.src].discard(flow)
        return True

    def _passed_sender(self, flow) -> None:
        """send_window: ``flow``'s bytes are off its sender's side: the sender's next batch may start."""
        if self._let_go(flow):
            self._start_next(flow.src)

    def _flow_left(self, flow) -> None:
        """``flow`` ended or was aborted: its sender's next batch may start."""
        self._let_go(flow)
        self._start_next(flow.src)

    def _start_next(self, src: str) -> None:
        """send_window: once nothing of ``src`` is on the wire, its next waiting batch starts."""
        queue = self._waiting.get(src)
        if self._holding[src] or not queue:
            return
        batch = queue[0][0]
        self._batch_on_wire[src] = batch
        while queue and queue[0][0] is batch:
            self._activate(queue.pop(0)[1])

    def _released(self, f) -> None:
        """send_window: the sender's event fires now; the flow goes on to its end."""
        now = self.env.now
        if isinstance(f, MulticastFlow):
            f.result = [FlowResult(f.src, dst, f.nbytes, f.start, now, None, lost, 0, released_at=now)
                        for dst, lost, _ in f.members]
        else:
            f.result = FlowResult(f.src, f.dst, f.nbytes, f.start, now, None, f.lost, 0, released_at=now)
        f.event.succeed(f.result)
