"""DDP for real across network namespaces (three "machines" on one box), step by step against emu.

    sudo .venv/bin/python -m tools.netns_ddp [--scenario scenarios/ddp_baseline.yaml]
        [--steps 8] [--mbps 100] [--set KEY=VALUE ...] [--out DIR] [--md FILE.md] [--reuse-real DIR]

The testbed is tools/netns_fl.py's (one namespace per worker behind a tbf-shaped
link, no route out, torn down at the end).  Every worker runs ``ddp.max_steps``
steps (evaluation on ``data.test_samples`` only after the last).

Then emu replays the real run: each worker's measured times of every step --
``compute_s`` (forward and backward) and ``compress_s`` (compressing before the
send and applying after the wait, both put before the send: the events give
their sum only) -- are given back to emu's compute model step by step, and the
gradients are computed for real (DGC's payload size depends on them), so only
emu's network and runtime decide the rest.  Twice: with the model of real mode's
transport (dtemu.emu.costs, `emu calibrate`: headers, the writer's history, the
receivers' decoding measured here) and with emu's defaults.

Per step and per run (mean over the workers):

* step time = compute_s + compress_s + comm_s (the step event's own parts);
* comm = step time minus compute (``compute_s + compress_s``), i.e. the step's
  send and wait.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from dtemu.host.rundir import read_events_partial
from tools.netns_fl import (ROOT, mean_cells, reuse_testbed, run_comparison, run_testbed, testbed_parser,
                             wire_overhead)


def step_rows(events: list[dict]) -> dict[str, dict[int, dict]]:
    """node -> step -> its step event."""
    out: dict = {}
    for e in events:
        if e["kind"] == "step":
            out.setdefault(e["node"], {})[e["step"]] = e
    return out


def compare(real_events: list[dict], emu_events: list[dict]) -> dict:
    real, emu = step_rows(real_events), step_rows(emu_events)
    steps = sorted(set.intersection(*(set(v) for v in (*real.values(), *emu.values()))) if real and emu else set())
    rows = []
    for s in steps:
        def mean(side, key):
            return statistics.fmean(key(per[s]) for per in side.values())

        def step_time(e):
            return e["compute_s"] + e["compress_s"] + e["comm_s"]

        r_t, e_t = mean(real, step_time), mean(emu, step_time)
        r_c, e_c = mean(real, lambda e: e["comm_s"]), mean(emu, lambda e: e["comm_s"])
        rows.append({"step": s, "real_s": r_t, "emu_s": e_t, "error_pct": 100 * (e_t - r_t) / r_t,
                     "real_comm_s": r_c, "emu_comm_s": e_c,
                     "comm_error_pct": 100 * (e_c - r_c) / r_c if r_c > 0 else float("nan"),
                     "bytes_sent": mean(real, lambda e: e["bytes_sent"])})
    # The first step also pays real mode's one-time costs (first samples on new writers and
    # readers, buffers growing): the mean without it is given too.
    return {"steps": rows, "mean": _mean(rows), "mean_after_first": _mean(rows[1:])}


def _mean(rows: list[dict]) -> dict:
    if not rows:
        return {}
    mean = {k: statistics.fmean(r[k] for r in rows) for k in
            ("real_s", "emu_s", "error_pct", "real_comm_s", "emu_comm_s", "comm_error_pct")}
    mean["abs_error_pct"] = statistics.fmean(abs(r["error_pct"]) for r in rows)
    mean["abs_comm_error_pct"] = statistics.fmean(abs(r["comm_error_pct"]) for r in rows)
    return mean


def run_emu_replay(scenario_path: str, sets: list[str], out: Path, real_events: list[dict]) -> dict:
    """emu in this process, every worker's compute and compression taking what they took for real."""
    import dtemu.emu.run as er
    from dtemu.host.scenario_file import load_scenario

    scenario = load_scenario(scenario_path, sets)
    names = scenario.node_names
    rows = step_rows(real_events)
    base = er.ComputeTimer

    class ReplayTimer(base):
        def __init__(self, spec, reference, seed, **timing):   # (timing: the batch its warm-up steps by)
            super().__init__(spec, reference or 1e-3, seed, **timing)
            steps = rows.get(names[seed[1]], {})
            self.train = [steps[s]["compute_s"] for s in sorted(steps)]
            # compress then apply, per step: their sum (all the event has) first, then nothing
            self.compress = [t for s in sorted(steps) for t in (steps[s]["compress_s"], 0.0)]

        def duration(self, samples, kind="train", now=0.0, nbytes=0):
            queue = self.train if kind == "train" else self.compress if kind == "compress" else None
            if queue:
                return queue.pop(0)
            return 0.0 if kind != "train" else super().duration(samples, kind, now=now, nbytes=nbytes)

    er.ComputeTimer = ReplayTimer
    try:
        return er.run_emulation(scenario, out)
    finally:
        er.ComputeTimer = base


def _table(cmp: dict) -> list[str]:
    lines = ["| step | MB sent | real s | emu s | error % | real comm s | emu comm s | comm error % |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in cmp["steps"]:
        lines.append(f"| {r['step']} | {r['bytes_sent'] / 1e6:.2f} | {r['real_s']:.3f} | {r['emu_s']:.3f} | "
                     f"{r['error_pct']:+.1f} | {r['real_comm_s']:.3f} | {r['emu_comm_s']:.3f} | "
                     f"{r['comm_error_pct']:+.1f} |")
    for label, key in (("mean", "mean"), ("mean from step 1", "mean_after_first")):
        m = cmp.get(key)
        if m:
            lines.append(f"| {label} | | " + mean_cells(m))
    return lines


def markdown(result: dict) -> str:
    cfg = result["config"]
    lines = [f"DDP over network namespaces vs emu: {cfg['scenario']} ({cfg['model']}, {cfg['compression']}), "
             f"{cfg['workers']} workers, {cfg['steps']} steps, links {cfg['mbps']:g} Mbit/s each way, "
             f"measured UDP RTT {cfg['rtt_ms']:.3f} ms (netem {'yes' if cfg['netem'] else 'not in this kernel'}); "
             f"emu latency_ms per link {cfg['emu_latency_ms']:.4f}; decoding {cfg['decode_s_per_mb'] * 1e3:.3f} "
             "ms/MB (dtemu.emu.costs, `emu calibrate`)."]
    if result.get("wire_overhead"):
        lines += ["", "Bytes on the shaped uplinks (tc) against the payload each worker sent: "
                  + ", ".join(f"{k} +{v['overhead_pct']:.2f}%" for k, v in result["wire_overhead"].items()) + "."]
    for key, title in (("compare_replay", "emu with the transport model, every worker's measured compute and "
                                          "compression replayed step by step:"),
                       ("compare_replay_payload", "the same replay with emu's defaults:")):
        lines += ["", title, ""] + _table(result[key])
    lines += ["", "step time = compute_s + compress_s + comm_s; comm = comm_s (send and wait), "
              "both the mean over the workers."]
    return "\n".join(lines) + "\n"


def run(scenario_path: str = "scenarios/ddp_baseline.yaml", *, steps: int = 8, mbps: float = 100.0,
        delay_ms: float = 2.0, extra_sets: list[str] = (), out: Path | None = None, keep: bool = False,
        timeout_s: float = 600.0, test_samples: int = 600, reuse: Path | None = None) -> dict:
    from dtemu.host.scenario_file import load_scenario
    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import num_params
    from dtemu.emu.costs import ddp_decode_cost, run_window, transport_sets

    out = Path(out or ROOT / "runs" / f"netns-ddp-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    sets = [f"ddp.max_steps={steps}", f"data.test_samples={test_samples}", *extra_sets]
    scen = load_scenario(scenario_path, sets)
    if reuse is not None:
        bed = reuse_testbed(Path(reuse))
        if Path(reuse).resolve() != out:
            import shutil

            shutil.copytree(Path(reuse) / "real", out / "real", dirs_exist_ok=True)
    else:
        bed = run_testbed(scenario_path, sets, out, mbps=mbps, delay_ms=delay_ms, keep=keep, timeout_s=timeout_s,
                          nodes=len(scen.node_names))
    real_events = read_events_partial(out / "real")[0]
    decode = ddp_decode_cost()
    # The writer history the real ranks ran with (DDP: one that holds a whole gradient).
    window = run_window(scen.mode, num_params(build_model(scen.model_spec, scen.seed)), out / "real")
    transport = transport_sets({name: decode for name in scen.node_names}, window)
    latency_ms = bed["applied_delay_ms"] + bed["rtt_ms"] / 4
    network = f"network.default={{up_mbps: {mbps:g}, down_mbps: {mbps:g}, latency_ms: {latency_ms:.4f}}}"
    result = {"config": {"scenario": scen.name, "model": scen.model, "compression": scen.ddp.compression,
                         "workers": len(scen.node_names), "steps": steps, "mbps": mbps,
                         "applied_delay_ms": bed["applied_delay_ms"], "netem": bed["netem"], "rtt_ms": bed["rtt_ms"],
                         "emu_latency_ms": latency_ms, "decode_s_per_mb": decode, "transport_sets": transport,
                         "sets": sets, "namespaces": bed["namespaces"], "addresses": bed["addresses"]},
              "real_summary": bed["real_summary"], "qdisc": bed["qdisc"], "drops": bed.get("drops", {}),
              "wire_overhead": wire_overhead(bed["qdisc"], out / "real", scen.node_names, bed["namespaces"])}
    for key, folder, extra in (("compare_replay", "emu-replay", transport),
                               ("compare_replay_payload", "emu-replay-payload", [])):
        t0 = time.monotonic()
        summary = run_emu_replay(scenario_path, sets + [network] + extra, out / folder, real_events)
        print(f"netns: emu replay {time.monotonic() - t0:.1f} s -> {out / folder}", file=sys.stderr, flush=True)
        result[key] = compare(real_events, read_events_partial(out / folder)[0])
        result[key + "_summary"] = summary
    (out / "netns_ddp.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "netns_ddp.md").write_text(markdown(result))
    return result


def main(argv=None) -> int:
    p = testbed_parser("netns_ddp", __doc__, "scenarios/ddp_baseline.yaml")
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args(argv)
    return run_comparison("netns_ddp", args, lambda: run(
        args.scenario, steps=args.steps, mbps=args.mbps, delay_ms=args.delay_ms, extra_sets=args.sets,
        out=args.out, keep=args.keep, timeout_s=args.timeout, reuse=args.reuse_real), markdown)


if __name__ == "__main__":
    sys.exit(main())
