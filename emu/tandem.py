"""With ``send_window`` (real mode's writer history), a flow crosses the network in two stages, as a
packet crosses the testbed's qdiscs: store and forward, not cut through.

1. **The sender's side** (its uplink, and its site's WAN uplink where it crosses one): the flow's
   bytes pass it at their max-min fair share of those ports alone (``rate_up``; ``passed`` counts
   them).  The sender's FIFO (emu.sender_fifo) lets its next message start once they have passed.
2. **The receiver's side** (its downlink, and its site's WAN downlink): the bytes that passed wait in
   that side's queue and drain at their fair share of those ports (``rate``; ``remaining`` counts
   what has not arrived).  Where nothing waits (``passed`` is what arrived), a flow cannot arrive
   faster than it passes the first stage: its ``rate_up`` caps it there.

A flow of several writer groups (``flow.bounds``, wire_model.group_bounds) stops its first stage
at each group's end (``blocked``) until the group is acknowledged: its queue must run dry (the
group's last byte arrived), and then the ACKNACK comes back behind what waits on the way back
(``ack_delay``).  Meanwhile its sender's side carries other flows, or idles.

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


def limit(flow) -> float:
    """Where the flow's first stage stops next: its group's end, or its end."""
    return flow.bounds[flow.group] if flow.group < len(flow.bounds) else flow.total


def blocked(flow, slack: float = 0.0) -> bool:
    """Its first stage is at a group's end, waiting for the group's acknowledgement."""
    return flow.group < len(flow.bounds) and flow.passed >= flow.bounds[flow.group] - slack - DUST_BYTES


def awaiting_ack(flow) -> bool:
    """Blocked with its queue dry: the group arrived, and its acknowledgement is due."""
    return blocked(flow) and queued(flow) <= DUST_BYTES


def advance(flow, elapsed: float, slack: float) -> tuple[bool, bool]:
    """Bring the flow's first stage to now (its ``remaining`` already is): whether it ended just now,
    and whether it stopped at a group's end just now.  ``slack``: seconds of float dust at env.now,
    within which a stage is done and a queue dry (a change due sooner than env.now can resolve would
    be armed again and again at the same instant)."""
    flow.passed = min(limit(flow), flow.passed + flow.rate_up * elapsed)
    ended = flow.rate_up > 0 and stage_one_done(flow, flow.rate_up * slack)
    stopped = not ended and flow.rate_up > 0 and blocked(flow, flow.rate_up * slack)
    if ended or stopped:
        flow.passed, flow.rate_up = limit(flow), 0.0
    if queued(flow) <= DUST_BYTES + max(flow.rate - flow.rate_up, 0.0) * slack:
        flow.remaining = flow.total - flow.passed
    return ended, stopped


def allocate(flows, capacity) -> None:
    """Each flow's ``rate_up`` (its first stage; 0 once done or blocked) and ``rate`` (its arrival;
    0 while blocked with nothing queued)."""
    first = [i for i, f in enumerate(flows) if not stage_one_done(f) and not blocked(f)]
    up = max_min_rates([sender_side(flows[i].ports) for i in first], capacity)
    for f in flows:
        f.rate_up = f.rate = 0.0
    for i, rate in zip(first, up):
        flows[i].rate_up = rate
    caps = dict(capacity)
    arriving, ports = [], []
    for i, f in enumerate(flows):
        if awaiting_ack(f):
            continue
        side = receiver_side(f.ports)
        if f.rate_up > 0 and queued(f) <= DUST_BYTES:   # nothing waits: it arrives as it passes
            caps[("passing", i)] = f.rate_up
            side.append(("passing", i))
        arriving.append(f)
        ports.append(side)
    for f, rate in zip(arriving, max_min_rates(ports, caps)):
        f.rate = rate


def next_change(flow) -> float | None:
    """Seconds until the flow's first stage ends or stops at a group's end, or its queue runs dry,
    whichever is sooner (None: none of them, at these rates)."""
    times = []
    if flow.rate_up > 0:
        times.append((limit(flow) - flow.passed) / flow.rate_up)
        if flow.rate > flow.rate_up and queued(flow) > DUST_BYTES:
            times.append(queued(flow) / (flow.rate - flow.rate_up))
    elif blocked(flow) and flow.rate > 0 and queued(flow) > DUST_BYTES:
        times.append(queued(flow) / flow.rate)
    return min(times, default=None)


def ack_delay(flows, capacity, ports_back) -> float:
    """Queueing time of an acknowledgement on its way back (``ports_back``: the receiver's
    uplink side, then the sender's downlink side).  A writer puts its whole current group in its
    link's queue at once, so an uplink holds what the first stages of its flows have still to pass
    of their groups; a downlink holds what waits at the receivers' side.  Each side's queue is its
    fullest port's (the bottleneck holds it)."""
    up = [p for p in ports_back if p[1] == "up"]
    down = [p for p in ports_back if p[1] != "up"]
    ahead_up = max((sum(limit(f) - f.passed for f in flows if p in sender_side(f.ports)
                        and not stage_one_done(f)) / capacity[p] for p in up), default=0.0)
    ahead_down = max((sum(queued(f) for f in flows if p in receiver_side(f.ports)) / capacity[p]
                      for p in down), default=0.0)
    return ahead_up + ahead_down
