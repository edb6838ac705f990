"""A run's units of work, as each mode counts them, for comparing two runs unit by unit (emu validate).

Each function takes a run's events and returns ``{unit: (time_s, comm_s)}``: the unit's time, read on
one clock, and its communication, the part that is not its slowest trainer's compute.  The mode names
its function (``Mode.units``), so that nothing here branches on a mode's name.

- FL and Flower: a round is the leader's ``round_close`` less the one before (rounds 2..: round 1
  also carries the start-up), so it holds the model's way out, the training, the updates' way back
  and what the controller does between rounds.  An asynchronous rule (FedAsync, ASGD) closes a
  "round" per version, so its unit is a version.  Compute: the slowest training among the clients
  the round took (``train_start`` to ``upload_start``, its encoding included; each client's last
  before the close).
- DDP: a step, the mean over the workers of each one's own compute, compression and ``comm_s``.
- ps (ESync): a global version at the parameter server (``ps_round`` less the one before); compute:
  the slowest worker's on it.
- geo: a round of the root PS (global or flat: ``geo_round`` closes, rounds 2..); compute: the
  slowest worker's gradient of the round.
"""

from __future__ import annotations

import statistics

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
    """Compute: the slowest training among the clients whose updates the round (or version) took, each
    its last before the close: a synchronous round's, or the one update an asynchronous version took."""
    closes = {e["round"]: e for e in events if e["kind"] == "round_close" and e.get("node") == leader}
    trainings = _trainings(events)
    times = _gaps({r: e["t"] for r, e in closes.items()})
    return {r: (t, t - max((_last_before(trainings.get(c, []), closes[r]["t"]) for c in closes[r].get("clients", [])),
                           default=0.0)) for r, t in times.items()}


def ddp_steps(events: list[dict], leader: str) -> Units:
    per: dict[int, list[dict]] = {}
    for e in events:
        if e["kind"] == "step":
            per.setdefault(e["step"], []).append(e)
    return {s: (statistics.fmean(e["compute_s"] + e.get("compress_s", 0.0) + e["comm_s"] for e in rows),
                statistics.fmean(e["comm_s"] for e in rows)) for s, rows in sorted(per.items())}


def esync_versions(events: list[dict], leader: str) -> Units:
    versions = {e["version"]: e["t"] for e in events if e["kind"] == "ps_round" and e.get("node") == leader}
    compute: dict[int, float] = {}
    total: dict[str, float] = {}
    for e in events:
        if e["kind"] == "ps_worker_round":  # its total compute so far, on its own clock
            spent = e["compute_s"] - total.get(e["node"], 0.0)
            total[e["node"]] = e["compute_s"]
            compute[e["round"]] = max(compute.get(e["round"], 0.0), spent)
    return {v: (t, t - compute.get(v, 0.0)) for v, t in _gaps(versions).items()}


def geo_rounds(events: list[dict], leader: str) -> Units:
    roots = {"global-ps", "ps"}
    closes = {e["round"]: e["t"] for e in events if e["kind"] == "geo_round" and e.get("node") in roots}
    compute: dict[int, float] = {}
    for e in events:
        if e["kind"] == "geo_step":
            compute[e["round"]] = max(compute.get(e["round"], 0.0), e["compute_s"])
    return {r: (t, t - compute.get(r, 0.0)) for r, t in _gaps(closes).items()}
