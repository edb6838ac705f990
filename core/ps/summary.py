"""Mode ps's part of summary.json (core.runtime.summary calls these; both runtimes share them).

A node's record: the parameter server's final model, accuracy, loss and history;
a worker's local iterations, samples, compute and blocking time; the state
server's queries and refusals.  The run's summary adds, beside the common keys:
``algorithm``, ``rounds`` (global versions made), ``rounds_failed``, ``updates``,
``final_loss``, ``blocking_time_s`` (per worker, seconds it waited for the next
model after pushing, less that model's transfer), ``local_iterations`` (per
worker, in all), ``iterations_per_round`` (per worker, mean per pushed update),
``samples_per_s`` (samples all workers trained on, per second of the run),
``bytes_per_node`` (sent and received, every node) and ``state_server``.
"""

from __future__ import annotations

from typing import Any

from dtemu.core.ml.params import sha256_of
from dtemu.core.ps.server import ServerResult
from dtemu.core.ps.state_server import StateServerResult
from dtemu.core.ps.worker import WorkerResult


def ps_record(result: Any) -> dict:
    if isinstance(result, ServerResult):
        return {"final_accuracy": result.final_accuracy, "final_loss": result.final_loss,
                "rounds": result.version, "rounds_failed": result.rounds_failed, "stop_reason": result.stop_reason,
                "updates": dict(sorted(result.counts.items())), "model_sha256": sha256_of(result.weights),
                "history": [[round(t, 9), a] for t, a in result.history]}
    if isinstance(result, WorkerResult):
        return {"rounds": result.rounds, "iterations": result.iterations, "samples": result.samples,
                "iterations_per_round": round(sum(result.per_round) / max(len(result.per_round), 1), 3),
                "compute_s": round(result.compute_s, 9), "blocking_time_s": round(result.blocking_s, 9),
                "dropped_rounds": result.dropped_rounds, "query_timeouts": result.query_timeouts,
                "not_finite": result.not_finite,
                "rejected": dict(result.rejected)}
    if isinstance(result, StateServerResult):
        return {"queries": result.queries, "answers": dict(result.answers), "rejected": dict(result.rejected)}
    return {}


def ps_summary(scenario, records: list[dict], no_accuracy: dict, time_s: float | None) -> dict:
    names = scenario.node_names
    lead, ss = records[0], records[1]
    workers = {n: r for n, r in zip(names[2:], records[2:])}
    samples = sum(r.get("samples", 0) for r in workers.values())
    return {
        "algorithm": scenario.ps.algorithm, "workers": scenario.ps.workers,
        "final_accuracy": lead.get("final_accuracy"), "final_loss": lead.get("final_loss"),
        "time_to_accuracy": lead.get("time_to_accuracy") or no_accuracy,
        "rounds": lead.get("rounds", 0), "rounds_failed": lead.get("rounds_failed", 0),
        "stop_reason": lead.get("stop_reason", "the parameter server left no record"),
        "updates": lead.get("updates", {}), "model_sha256": lead.get("model_sha256"),
        "blocking_time_s": {n: r.get("blocking_time_s") for n, r in workers.items()},
        "local_iterations": {n: r.get("iterations") for n, r in workers.items()},
        "iterations_per_round": {n: r.get("iterations_per_round") for n, r in workers.items()},
        "samples_per_s": round(samples / time_s, 3) if time_s else None,
        "bytes_per_node": {n: {"sent": r.get("bytes_sent", 0), "received": r.get("bytes_received", 0)}
                           for n, r in zip(names, records)},
        "state_server": state_server_summary(ss),
    }


def state_server_summary(record: dict) -> dict:
    """summary.json's ``state_server``, from its node's record (mode ps; FL's esync)."""
    return {k: record.get(k) for k in ("queries", "answers", "rejected") if k in record}
