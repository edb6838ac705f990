"""``summary.json``: one schema for both runtimes, written once.

Each node's numbers are a *record* (``node_record``): what its role returned
and the bytes it sent and received.  emu makes every record in one process;
real writes each rank's record into its own folder, and ``real launch`` reads
them back.  ``run_summary`` turns the records into the run's summary:

    scenario, runtime, mode, seed, sealed (every node sealed its messages: --key-file), final_accuracy, model_sha256, stop_reason ("done" or why not),
    bytes_up / bytes_down (sent / accepted by the training nodes: FL clients, DDP workers),
    bytes_rejected (what every node's role read and refused: counted apart from the traffic),
    time_s (the run's length on the runtime's clock: virtual in emu, wall from the common start in real),
    wall_time_s,
    time_to_accuracy (each target of ``scenario.targets``, as a string such as "0.8", to the first
        time on the runtime's clock an evaluation reached it, or null),
    FL:  codec, rounds, rounds_failed, updates (accepted / late / rejected / ... counts)
    DDP: compression, workers, steps, bytes_per_step, models_agree, lost_ranks, survivors
    geo: architecture, compression, rounds, models_agree, wan_bytes, wan, comm_s_per_round, lost
        (core.geo.report)
    platform (the library versions and CPU kernels the run trained with: host.cpu_arith.describe,
        given by the runtime),
    and what only one runtime knows under its own key: "emu" (wire_bytes, with
    retransmissions) or "real" (exit codes, transport counters).
"""

from __future__ import annotations

from typing import Any

from dtemu.core.modes.base import DONE
from dtemu.core.scenario import Scenario

__all__ = ["DONE", "failed_summary", "node_record", "run_summary", "time_to_accuracy"]


def time_to_accuracy(history: list[tuple[float, float]], targets) -> dict[str, float | None]:
    """For each target accuracy, the first time (runtime clock) an evaluation in ``history``
    ((time, accuracy) pairs, in time order) reached it; None if none did."""
    out: dict[str, float | None] = {}
    for target in targets:
        hit = next((t for t, acc in history if acc is not None and acc >= target), None)
        out[str(target)] = None if hit is None else round(hit, 9)
    return out


def node_record(scenario: Scenario, name: str, result: Any, bytes_sent: int, bytes_received: int,
                time_s: float | None = None, bytes_rejected: int = 0, sealed: bool = False) -> dict:
    """One node's numbers; ``result`` is what its role returned (None: it never finished).

    ``bytes_received`` counts what the node took in; the part its role refused (forged, malformed,
    late, duplicate ...: ``bytes_rejected``) is not traffic it accepted and is counted apart.
    ``sealed``: did the node seal and open its messages with the run's key (core.wire.auth)?"""
    record: dict[str, Any] = {"node": name, "bytes_sent": bytes_sent,
                              "bytes_received": bytes_received - bytes_rejected, "bytes_rejected": bytes_rejected,
                              "sealed": sealed}
    if time_s is not None:
        record["time_s"] = round(time_s, 9)
    if result is None:
        return record
    record.update(scenario.kind.record(scenario, name, result,
                                       lambda history: time_to_accuracy(history, scenario.targets)))
    return record


def run_summary(scenario: Scenario, runtime: str, records: list[dict | None], *, time_s: float | None,
                wall_time_s: float, extra: dict | None = None, platform: dict | None = None,
                device: str = "cpu") -> dict:
    """The run's summary from every rank's record (None or {} for a rank that left none)."""
    records = [r or {} for r in records]
    trains = set(scenario.training_nodes)  # once: a list rebuilt per node is quadratic at 10,000 clients
    training = [r for r, name in zip(records, scenario.node_names) if name in trains]
    summary: dict[str, Any] = {
        "scenario": scenario.name, "runtime": runtime, "mode": scenario.mode, "seed": scenario.seed,
        # every node that left a record sealed its messages with the run's key
        "sealed": any(records) and all(r["sealed"] for r in records if "sealed" in r),
        "bytes_up": sum(r.get("bytes_sent", 0) for r in training),
        "bytes_down": sum(r.get("bytes_received", 0) for r in training),
        "bytes_rejected": sum(r.get("bytes_rejected", 0) for r in records),
        "time_s": None if time_s is None else round(time_s, 9),
        "wall_time_s": round(wall_time_s, 3),
        "time_to_accuracy": time_to_accuracy([], scenario.targets),
        "device": device,  # where it trained (host.devices: the scenario's key, resolved)
    }
    summary.update(scenario.kind.summary(scenario, records, lambda history: time_to_accuracy(history, scenario.targets),
                                         time_s))
    summary["platform"] = platform or {}
    summary[runtime] = extra or {}
    return summary


def failed_summary(scenario: Scenario, runtime: str, error: BaseException, *, wall_time_s: float,
                   time_s: float | None = None, platform: dict | None = None) -> dict:
    """The summary of a run that stopped on an error before it could finish (a bad checkpoint,
    a barrier timeout, missing data): the same schema, nothing measured, ``stop_reason`` the error."""
    summary = run_summary(scenario, runtime, [{}] * len(scenario.node_names), time_s=time_s,
                          wall_time_s=wall_time_s, platform=platform)
    summary["stop_reason"] = f"{type(error).__name__}: {error}"
    summary["failed"] = True
    return summary
