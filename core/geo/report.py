"""summary.json of a geo run: each role's record and the run's numbers (called by
``core.runtime.summary``, so both runtimes write the same fields).

    architecture, compression, sync, rounds, final_accuracy, time_to_accuracy (the master's
    evaluations), model_sha256 (the master's model), models_agree (every worker ends with it),
    wan_bytes (every byte that crossed a WAN link, both directions, the initial model included),
    wan (per WAN node and round, rounds only: bytes up and down, and as a fraction of the dense
    fp32 model; a WAN node is a local PS under HiPS, a worker under the flat PS),
    comm_s_per_round (workers' mean push-to-pull time), rejected, survivors (workers that did every
    round), stop_reason (the master's and root PS's: a lost site's workers stop, the run goes on),
    lost (the nodes some role gave up waiting for)
"""

from __future__ import annotations

from typing import Any

from dtemu.core.ml.params import sha256_of

DONE = "done"


def geo_record(result) -> dict[str, Any]:
    r = result
    rec = {"role": r.role, "site": r.site, "rounds": r.rounds, "wan_sent": r.wan_sent,
           "wan_received": r.wan_received, "wan_init": r.wan_init, "rejected": r.rejected,
           "stop_reason": r.stop_reason or DONE, "lost": list(r.lost)}
    if r.weights is not None:
        rec["model_sha256"] = sha256_of(r.weights)
        rec["dim"] = int(r.weights.size)
    if r.role == "master":
        rec["final_accuracy"] = r.final_accuracy
    if r.comm_s:
        rec["comm_s_mean"] = round(sum(r.comm_s) / len(r.comm_s), 9)
    return rec


def geo_summary(scenario, records: list[dict], no_hits: dict) -> dict[str, Any]:
    g = scenario.geo
    by_name = dict(zip(scenario.node_names, records))
    master = by_name.get(scenario.node_names[0], {})
    workers = [by_name[n] for n in scenario.training_nodes]
    wan_nodes = [rec for rec in records if rec.get("role") == ("local_ps" if g.architecture == "hips" else "worker")]
    rounds = master.get("rounds", 0)
    dim = master.get("dim")
    n = max(len(wan_nodes), 1) * max(rounds, 1)
    up = sum(r.get("wan_sent", 0) for r in wan_nodes) / n
    down = sum(r.get("wan_received", 0) for r in wan_nodes) / n
    dense = 4 * dim if dim else None
    # The run's fate is the master's and the root PS's: a lost site's workers stop, the run goes on.
    leads = [master, by_name.get(scenario.node_names[1], {})]
    reasons = [r["stop_reason"] for r in leads if r.get("stop_reason", DONE) != DONE]
    if not master:
        reasons.append("the master left no record")
    survivors = [w for w in workers if w.get("rounds") == g.rounds]
    comm = [r["comm_s_mean"] for r in workers if "comm_s_mean" in r]
    sha = master.get("model_sha256")
    return {
        "architecture": g.architecture, "compression": g.compression, "sync": g.sync,
        "rounds": rounds, "final_accuracy": master.get("final_accuracy"),
        "time_to_accuracy": master.get("time_to_accuracy") or no_hits,
        "model_sha256": sha,
        # FSA: every worker that did every round ends with the master's model (MixedSync: with
        # the weights of its site's last pull, so this says little there)
        "models_agree": bool(sha) and bool(survivors) and all(w.get("model_sha256") == sha for w in survivors),
        "survivors": len(survivors),
        "wan_bytes": sum(r.get("wan_sent", 0) + r.get("wan_init", 0) for r in records),
        "wan": {"nodes": len(wan_nodes), "up_per_node_round": round(up, 3), "down_per_node_round": round(down, 3),
                "dense_bytes": dense,
                "up_ratio": round(up / dense, 6) if dense else None,
                "down_ratio": round(down / dense, 6) if dense else None},
        "comm_s_per_round": round(sum(comm) / len(comm), 9) if comm else None,
        "rejected": sum(r.get("rejected", 0) for r in records),
        "stop_reason": reasons[0] if reasons else DONE,
        "lost": sorted({x for r in records for x in r.get("lost", [])}),
    }
