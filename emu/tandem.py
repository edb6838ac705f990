"""With ``send_window`` (real mode's writer history), a flow crosses the network in two stages, as a
packet crosses the testbed's qdiscs: store and forward, not cut through.

1. **The sender's side** (its uplink, and its site's WAN uplink where it crosses one): the flow's
   bytes pass it at their max-min fair share of those ports alone (``rate_up``; ``passed`` counts
   them).  The sender's FIFO (emu.sender_fifo) lets its next message start once they have passed.
2. **The receiver's side** (its downlink, and its site's WAN downlink): the bytes that passed wait in
   that side's queue and drain at their fair share of those ports (``rate``; ``remaining`` counts
   what has not arrived).  Where nothing waits (``passed`` is what arrived), a flow cannot arrive
   faster than it passes the first stage: its ``rate_up`` caps it there.

Why: as one fluid over all its ports, a flow to a busy receiver held the sender's uplink at the
receiver's pace.  A DDP worker's piece to a member whose downlink was shared then slowed its next
piece, to a member waiting for it: emu's dense allreduce took 5-6% longer than the testbed's,
whose uplink sends each piece at its full rate and queues the rest at the receiver's side
(notebook entry 36).  Each stage is still one fluid: several queues on one side (a WAN uplink
behind an access uplink) are one.
"""

from __future__ import annotations

from .fair_share import max_min_rates

# Bytes of float dust below which a flow's stage is taken as done or its queue as empty.
DUST_BYTES = 1e-6


def sender_side(ports) -> list:
    return [p for p in ports if p[1] == "up"]


def receiver_side(ports) -> list:
    return [p for p in ports if p[1] == "down"]


def queued(flow) -> float:
    """Bytes that passed the sender's side and have not arrived."""
    return flow.passed - (flow.total - flow.remaining)


def stage_one_done(flow, slack: float = 0.0) -> bool:
    return flow.passed >= flow.total - slack - DUST_BYTES


def advance(flow, elapsed: float, slack: float) -> bool:
    """Bring the flow's first stage to now (its ``remaining`` already is); True if it ended just now.
    ``slack``: seconds of float dust at env.now, within which a stage is done and a queue dry (a change
    due sooner than env.now can resolve would be armed again and again at the same instant)."""
    flow.passed = min(flow.total, flow.passed + flow.rate_up * elapsed)
    ended = flow.rate_up > 0 and stage_one_done(flow, flow.rate_up * slack)
    if ended:
        flow.passed, flow.rate_up = flow.total, 0.0
    if queued(flow) <= DUST_BYTES + max(flow.rate - flow.rate_up, 0.0) * slack:
        flow.remaining = flow.total - flow.passed
    return ended


def allocate(flows, capacity) -> None:
    """Each flow's ``rate_up`` (its first stage; 0 once done) and ``rate`` (its arrival)."""
    first = [i for i, f in enumerate(flows) if not stage_one_done(f)]
    up = max_min_rates([sender_side(flows[i].ports) for i in first], capacity)
    for f in flows:
        f.rate_up = 0.0
    for i, rate in zip(first, up):
        flows[i].rate_up = rate
    caps = dict(capacity)
    ports = []
    for i, f in enumerate(flows):
        side = receiver_side(f.ports)
        if f.rate_up > 0 and queued(f) <= DUST_BYTES:   # nothing waits: it arrives as it passes
            caps[("passing", i)] = f.rate_up
            side.append(("passing", i))
        ports.append(side)
    for f, rate in zip(flows, max_min_rates(ports, caps)):
        f.rate = rate


def next_change(flow) -> float | None:
    """Seconds until the flow's first stage ends or its queue runs dry, whichever is sooner
    (None: neither, at these rates)."""
    times = []
    if flow.rate_up > 0:
        times.append((flow.total - flow.passed) / flow.rate_up)
        if flow.rate > flow.rate_up and queued(flow) > DUST_BYTES:
            times.append(queued(flow) / (flow.rate - flow.rate_up))
    return min(times, default=None)
