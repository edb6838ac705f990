"""A run's units of work, as each mode counts them, for comparing two runs unit by unit (emu validate).

Each function takes a run's events and returns ``{unit: (time_s, comm_s)}``: the unit's time, read on
one clock, and its communication, the part that is not its slowest trainer's compute.  The mode names
its function (``Mode.units``), so that nothing here branches on a mode's name.

- FL and Flower: a round is the leader's ``round_close`` less the one before (rounds 2..: round 1
  also carries the start-up), so it holds the model's way out, the training, the updates' way back
  and what the controller does between rounds.  Compute: the slowest training among the clients
  the round took (``train_start`` to ``upload_start``, its encoding included; each client's last
  before the close).  An asynchronous rule (FedAsync, ASGD) closes a "round" per version, so its
  unit is a version, and its communication that of the update the version took: its model's way
  down and its own way up.
- DDP: a step, the mean over the workers of each one's own compute, compression and ``comm_s``.
- geo: a round of the root PS (global or flat: ``geo_round`` closes, rounds 2..); compute: the
  slowest worker's gradient of the round.
"""

from __future__ import annotations

import statistics

from dtemu.core.wire.topics import MODEL_BLOB

Units = dict[int, tuple[float, float]]


def _gaps(times: dict[int, float]) -> dict[int, float]:
    return {u: times[u] - times[u - 1] for u in sorted(times) if u - 1 in times}


def _trainings(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """client -> its trainings as (when its upload started, how long it trained), in time order."""
    start: dict = {}
    out: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e["kind"] == "train_start":
            start[(e["node"], e["round"])] = e["t"]
        elif e["kind"] == "upload_start" and (e["node"], e["round"]) in start:
            out.setdefault(e["node"], []).append((e["t"], e["t"] - start[(e["node"], e["round"])]))
    return {c: sorted(v) for c, v in out.items()}


def _last_before(trainings: list[tuple[float, float]], t: float) -> float:
    """How long the last of a client's trainings whose upload started by ``t`` took (0: none)."""
    done = [d for at, d in trainings if at <= t]
    return done[-1] if done else 0.0


def leader_rounds(events: list[dict], leader: str) -> Units:
    """Compute: the slowest training among the clients whose updates the round took, each its last
    before the close.  An asynchronous version (its update logged with its ``staleness``) overlaps
    other clients' trainings, so its time less a training means nothing: its communication is that
    of the update it took, its model's way down and its own way up (``_update_trips``)."""
    closes = {e["round"]: e for e in events if e["kind"] == "round_close" and e.get("node") == leader}
    trainings = _trainings(events)
    trips = _update_trips(events, leader)
    times = _gaps({r: e["t"] for r, e in closes.items()})
    return {r: (t, trips[r] if r in trips else
                t - max((_last_before(trainings.get(c, []), closes[r]["t"]) for c in closes[r].get("clients", [])),
                        default=0.0)) for r, t in times.items()}


def _update_trips(events: list[dict], leader: str) -> dict[int, float]:
    """version -> the seconds its update spent travelling (asynchronous versions only): its way up
    (``update_accepted``'s ``comm_s``) and the way down of the model its client trained from, the
    last to arrive before its training started.  Each ``comm_s`` is one message's, so no time
    here compares two nodes' clocks: a message's arrival, ``sent_at + comm_s``, is its receiver's
    ``received_at``.  (Arrival, not the ``deliver`` event's time, which is when the role took it: a
    real client may take its command before a model that came with it and train on, taking the
    model after; which copy of the same version it took first is the role's order, not the wire's.)"""
    models: dict[str, list[tuple[float, float]]] = {}   # client -> (arrived at, comm_s) of each model
    began: dict[tuple[str, int], float] = {}            # (client, its command's round) -> training began
    taken = []
    for e in events:
        if e["kind"] == "deliver" and e.get("topic") == MODEL_BLOB:
            models.setdefault(e["node"], []).append((e.get("sent_at", e["t"] - e["comm_s"]) + e["comm_s"], e["comm_s"]))
        elif e["kind"] == "train_start":
            began[(e["node"], e["round"])] = e["t"]
        elif e["kind"] == "update_accepted" and e.get("node") == leader and "staleness" in e:
            taken.append(e)
    trips = {}
    for e in taken:   # version V took an update from version V - 1 - staleness: its command was V - staleness
        start = began.get((e["client"], e["round"] - e["staleness"]))
        down = max(((at, c) for at, c in models.get(e["client"], []) if start is not None and at <= start),
                   default=(None, 0.0))
        trips[e["round"]] = e["comm_s"] + down[1]
    return trips


def ddp_steps(events: list[dict], leader: str) -> Units:
    per: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] == "step":
            per.setdefault(e["step"], []).append(e)
    return {s: (statistics.fmean(e["compute_s"] + e.get("compress_s", 0.0) + e["comm_s"] for e in rows),
                statistics.fmean(e["comm_s"] for e in rows)) for s, rows in sorted(per.items())}


def geo_rounds(events: list[dict], leader: str) -> Units:
    roots = {"global-ps", "ps"}
    closes = {e["round"]: e["t"] for e in events if e["kind"] == "geo_round" and e.get("node") in roots}
    compute: dict[int, float] = {}
    for e in events:
        if e["kind"] == "geo_step":
            compute[e["round"]] = max(compute.get(e["round"], 0.0), e["compute_s"])
    return {r: (t, t - compute.get(r, 0.0)) for r, t in _gaps(closes).items()}
