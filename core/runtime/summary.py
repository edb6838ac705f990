"""``summary.json``: one schema for both runtimes, written once.

Each node's numbers are a *record* (``node_record``): what its role returned
and the bytes it sent and received.  emu makes every record in one process;
real writes each rank's record into its own folder, and ``real launch`` reads
them back.  ``run_summary`` turns the records into the run's summary:

    scenario, runtime, mode, seed, final_accuracy, model_sha256, stop_reason ("done" or why not),
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

from dtemu.core.geo.report import geo_record, geo_summary
from dtemu.core.ml.params import sha256_of
from dtemu.core.ps.summary import ps_record, ps_summary
from dtemu.core.scenario import CONTROLLER, Scenario

DONE = "done"


def time_to_accuracy(history: list[tuple[float, float]], targets) -> dict[str, float | None]:
    """For each target accuracy, the first time (runtime clock) an evaluation in ``history``
    ((time, accuracy) pairs, in time order) reached it; None if none did."""
    out: dict[str, float | None] = {}
    for target in targets:
        hit = next((t for t, acc in history if acc is not None and acc >= target), None)
        out[str(target)] = None if hit is None else round(hit, 9)
    return out


def node_record(scenario: Scenario, name: str, result: Any, bytes_sent: int, bytes_received: int,
                time_s: float | None = None, bytes_rejected: int = 0) -> dict:
    """One node's numbers; ``result`` is what its role returned (None: it never finished).

    ``bytes_received`` counts what the node took in; the part its role refused (forged, malformed,
    late, duplicate ...: ``bytes_rejected``) is not traffic it accepted and is counted apart."""
    record: dict[str, Any] = {"node": name, "bytes_sent": bytes_sent,
                              "bytes_received": bytes_received - bytes_rejected, "bytes_rejected": bytes_rejected}
    if time_s is not None:
        record["time_s"] = round(time_s, 9)
    if result is None:
        return record
    if scenario.mode == "geo":
        record.update(geo_record(result), time_to_accuracy=time_to_accuracy(result.history, scenario.targets))
        return record
    if scenario.mode == "ps":
        record.update(ps_record(result))
        if "history" in record:
            record["time_to_accuracy"] = time_to_accuracy(record["history"], scenario.targets)
        return record
    if scenario.mode == "ddp":
        record.update(final_accuracy=result.final_accuracy, steps=result.steps,
                      time_to_accuracy=time_to_accuracy(result.history, scenario.targets),
                      # what the steps' exchanges sent (no barrier, no evaluation)
                      step_bytes_sent=result.bytes_sent, model_sha256=sha256_of(result.weights),
                      # after a loss (ddp.on_worker_lost): why it stopped, the ranks lost, its membership
                      stop_reason=result.stop_reason or DONE, lost_ranks=list(result.lost_ranks),
                      members=list(result.members), generation=result.generation)
    elif name == CONTROLLER:
        record.update(final_accuracy=result.final_accuracy, rounds=result.rounds_completed,
                      time_to_accuracy=time_to_accuracy(result.history, scenario.targets),
                      rounds_failed=result.rounds_failed, stop_reason=result.stop_reason,
                      updates=dict(sorted(result.counts.items())), model_sha256=sha256_of(result.weights))
    else:
        record["model_round"] = result
    return record


def run_summary(scenario: Scenario, runtime: str, records: list[dict | None], *, time_s: float | None,
                wall_time_s: float, extra: dict | None = None, platform: dict | None = None) -> dict:
    """The run's summary from every rank's record (None or {} for a rank that left none)."""
    records = [r or {} for r in records]
    trains = set(scenario.training_nodes)  # once: a list rebuilt per node is quadratic at 10,000 clients
    training = [r for r, name in zip(records, scenario.node_names) if name in trains]
    summary: dict[str, Any] = {
        "scenario": scenario.name, "runtime": runtime, "mode": scenario.mode, "seed": scenario.seed,
        "bytes_up": sum(r.get("bytes_sent", 0) for r in training),
        "bytes_down": sum(r.get("bytes_received", 0) for r in training),
        "bytes_rejected": sum(r.get("bytes_rejected", 0) for r in records),
        "time_s": None if time_s is None else round(time_s, 9),
        "wall_time_s": round(wall_time_s, 3),
        "time_to_accuracy": time_to_accuracy([], scenario.targets),
    }
    if scenario.mode == "geo":
        summary.update(geo_summary(scenario, records, time_to_accuracy([], scenario.targets)))
    elif scenario.mode == "ps":
        summary.update(ps_summary(scenario, records, time_to_accuracy([], scenario.targets), time_s))
    else:
        summary.update(_ddp(scenario, records) if scenario.mode == "ddp" else _fl(scenario, records[0]))
    summary["platform"] = platform or {}
    summary[runtime] = extra or {}
    return summary


def _fl(scenario: Scenario, lead: dict) -> dict:
    return {"codec": scenario.fl.codec, "final_accuracy": lead.get("final_accuracy"),
            "time_to_accuracy": lead.get("time_to_accuracy") or time_to_accuracy([], scenario.targets),
            "rounds": lead.get("rounds", 0), "rounds_failed": lead.get("rounds_failed", 0),
            "stop_reason": lead.get("stop_reason", "the controller left no record"),
            "updates": lead.get("updates", {}), "model_sha256": lead.get("model_sha256")}


def _ddp(scenario: Scenario, records: list[dict]) -> dict:
    """The numbers of the survivors: the ranks that finished and that no survivor lost (a crashed
    rank leaves no record; one restarted after it was lost is refused, so it is not one)."""
    done = {rank: r for rank, r in enumerate(records) if r.get("model_sha256")}
    lost = sorted({k for r in done.values() for k in r.get("lost_ranks", [])}
                  | {rank for rank in range(len(records)) if rank not in done})
    survivors = {rank: r for rank, r in done.items() if rank not in lost}
    hashes = sorted({r["model_sha256"] for r in survivors.values()})
    steps = min((r.get("steps", 0) for r in survivors.values()), default=0)
    reasons = [r["stop_reason"] for r in survivors.values() if r.get("stop_reason", DONE) != DONE]
    first = next(iter(survivors.values()), {})
    return {"compression": scenario.ddp.compression, "workers": scenario.ddp.workers,
            "final_accuracy": first.get("final_accuracy"), "steps": steps,
            "time_to_accuracy": first.get("time_to_accuracy") or time_to_accuracy([], scenario.targets),
            "bytes_per_step": round(sum(r.get("step_bytes_sent", 0) for r in survivors.values())
                                    / max(steps, 1) / max(len(survivors), 1), 3),
            "model_sha256": hashes[0] if hashes else None, "models_agree": len(hashes) == 1,
            "stop_reason": reasons[0] if reasons else DONE, "lost_ranks": lost,
            "survivors": sorted(survivors)}


def failed_summary(scenario: Scenario, runtime: str, error: BaseException, *, wall_time_s: float,
                   time_s: float | None = None, platform: dict | None = None) -> dict:
    """The summary of a run that stopped on an error before it could finish (a bad checkpoint,
    a barrier timeout, missing data): the same schema, nothing measured, ``stop_reason`` the error."""
    summary = run_summary(scenario, runtime, [{}] * len(scenario.node_names), time_s=time_s,
                          wall_time_s=wall_time_s, platform=platform)
    summary["stop_reason"] = f"{type(error).__name__}: {error}"
    summary["failed"] = True
    return summary
