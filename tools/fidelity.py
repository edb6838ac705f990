"""emu's a-priori prediction of real runs, one row per mode: docs/fidelity.md and docs/fidelity.json.

    sudo DTEMU_DATA=../shared/data .venv/bin/python -m tools.fidelity [--rows fl,ddp_dense,...]
        [--out DIR] [--md docs/fidelity.md] [--json docs/fidelity.json]

Needs root (``ip netns``, ``tc``; tools/netns_fl.py builds the testbed).  For
each row, in this order:

1. ``emu calibrate --together`` (``--alone``: without it) of the row's scenario, with the row's settings,
   here in the root namespace before anything else runs: the profile (this
   machine's training step with every training rank of the row at once, as the
   testbed runs them all on this box; codec and decoding costs, each message's
   CPU, real mode's framing and writer history).  Nothing in it comes from the
   run it predicts.
2. The real run: one ``real run`` process per rank, each rank (or, for geo,
   each site) in its own network namespace behind links shaped with tc.
3. ``emu run --profile PROFILE`` of the same scenario and settings, with the
   testbed's links: their rate, and as latency a quarter of the UDP round trip
   measured before the run (this kernel has no netem); with ``--alone``, the
   box's cores as ``compute.shared_cores`` (with ``--together`` the sharing is
   in the profile's costs already).
4. The comparison, unit by unit (round, step, or ESync version), on one clock
   each: the controller's, a worker's own, the parameter server's.

The unit's time and its communication (the unit's time less its slowest
trainer's compute, or DDP's ``comm_s``) are compared as means over the units;
``time_error`` and ``comm_error`` are (emu - real) / real of those means, as
fractions.  ``same_model`` compares ``model_sha256``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from dtemu.host.rundir import read_events_partial
from tools import netns_ddp, netns_fl, netns_geo

ROOT = netns_fl.ROOT
MBPS = 100.0  # the links of the fl, ddp and ps rows
GEO_WAN_MBPS = 20.0


def esync_versions(events: list[dict]) -> dict[int, float]:
    """version -> the parameter server's ps_round minus the previous one (versions 2..)."""
    t = {e["version"]: e["t"] for e in events if e["kind"] == "ps_round" and e["node"] == "ps"}
    return {v: t[v] - t[v - 1] for v in sorted(t) if v - 1 in t}


def esync_compute(events: list[dict]) -> dict[int, float]:
    """version -> the slowest worker's compute on it (each worker's ps_worker_round says its total
    so far, on its own clock)."""
    out: dict = {}
    total: dict = {}
    for e in events:
        if e["kind"] == "ps_worker_round":
            spent = e["compute_s"] - total.get(e["node"], 0.0)
            total[e["node"]] = e["compute_s"]
            out[e["round"]] = max(out.get(e["round"], 0.0), spent)
    return out


def compare_esync(real_events: list[dict], emu_events: list[dict]) -> dict:
    """Per version: its time at the parameter server (its ps_round less the one before), and its
    communication (that time less the slowest worker's compute on it: the model out, the updates
    back, the state server's answers)."""
    real_v, emu_v = esync_versions(real_events), esync_versions(emu_events)
    real_c, emu_c = esync_compute(real_events), esync_compute(emu_events)
    rows = []
    for v in sorted(set(real_v) & set(emu_v)):
        real_comm, emu_comm = real_v[v] - real_c.get(v, 0.0), emu_v[v] - emu_c.get(v, 0.0)
        rows.append({"round": v, "real_s": real_v[v], "emu_s": emu_v[v],
                     "error_pct": 100 * (emu_v[v] - real_v[v]) / real_v[v],
                     "real_comm_s": real_comm, "emu_comm_s": emu_comm,
                     "comm_error_pct": 100 * (emu_comm - real_comm) / real_comm if real_comm > 0 else float("nan")})
    return {"rounds": rows, "mean": netns_ddp._mean(rows)}


@dataclass
class Row:
    mode: str
    scenario: str
    sets: list[str]
    compare: Callable | None = None  # real events, emu events -> {"mean": ...}; None: geo's tool
    unit: str = "round"
    geo: dict = field(default_factory=dict)  # netns_geo.run's arguments


FL_SETS = ["fl.rounds=6", "fl.subset=500", "fl.eval_every=1006", "data.test_samples=2000", "fl.min_clients=2",
           "threads=1"]
DDP_SETS = ["ddp.max_steps=16", "data.test_samples=600", "threads=1"]
PS_SETS = ["model=mnist_cnn", "ps.workers=2", "ps.rounds=12", "ps.eval_every=1000", "data.test_samples=500", "threads=1",
           "ps.min_workers=2", "compute.nodes={worker2: {slowdown: 4}}"]
GEO = {"rounds": 30, "workers_per_site": 2, "model": "small_cnn", "test_samples": 500}
ROWS = {
    "fl": Row("fl", "scenarios/fl_codecs.yaml", FL_SETS, netns_fl.compare),
    "ddp_dense": Row("ddp", "scenarios/ddp_baseline.yaml", DDP_SETS, netns_ddp.compare, "step"),
    "ddp_dgc": Row("ddp", "scenarios/ddp_dgc.yaml", DDP_SETS, netns_ddp.compare, "step"),
    "ps_esync": Row("ps", "scenarios/esync.yaml", PS_SETS, compare_esync, "version"),
    "geo_hips": Row("geo", "scenarios/geo_hips.yaml", [], None, "round", GEO),
    "geo_bisparse_fp16": Row("geo", "scenarios/geo_bisparse_fp16.yaml", [], None, "round", GEO),
}


def calibrate(row: Row, sets: list[str], profile: Path, together: bool = True) -> float:
    """``emu calibrate`` of the row (a process of its own, as a user runs it); seconds it took.
    ``together``: the testbed's ranks are processes of this one box, which is known before the run."""
    cmd = [sys.executable, "-m", "dtemu.emu.cli", "calibrate", row.scenario, "--out", str(profile)]
    cmd += ["--together"] if together else []
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise netns_fl.NetnsError(f"emu calibrate failed ({p.returncode}): {p.stderr[-2000:]}")
    return time.monotonic() - t0


def shared_cores(together: bool) -> list[str]:
    """The ranks' sharing of this box, for emu: in the profile's training step when calibrated
    together; else the box's cores as a queue for the CPU work priced per MB (compute.shared_cores).
    Not both: the queue on top of costs measured under contention counts it twice (dense DDP's
    comm came out 0.70 s with it, 0.557 s without, against real's 0.556-0.558)."""
    return [] if together else [f"compute.shared_cores={os.cpu_count() or 1}"]


def run_row(name: str, row: Row, out: Path, timeout_s: float, together: bool = True) -> dict:
    from dtemu.host.scenario_file import load_scenario

    out.mkdir(parents=True, exist_ok=True)
    profile = out / "profile.yaml"
    if row.geo:  # a row of sites: netns_geo's testbed (a namespace per site, WAN links)
        sets = netns_geo.base_sets(row.geo["rounds"], row.geo["workers_per_site"], row.geo["model"],
                                   row.geo["test_samples"])
        calibrate_s = calibrate(row, sets, profile, together)
        result = netns_geo.run(row.scenario, mbps=GEO_WAN_MBPS, out=out, timeout_s=timeout_s, profile=profile,
                               apriori_sets=shared_cores(together), **row.geo)
        cmp = result["compare_apriori"]
        real_sha, emu_sha = result["sha256"]["real"], result["sha256"]["emu-apriori"]
        links = (f"WAN {GEO_WAN_MBPS:g} Mbit/s each way per site, LAN {result['config']['emu_lan_mbps']:.0f} Mbit/s "
                 f"(measured), UDP datagrams dropped in the kernel: {_drops(result.get('drops', {}))}")
    else:
        sets = list(row.sets)
        calibrate_s = calibrate(row, sets, profile, together)
        scen = load_scenario(row.scenario, sets)
        bed = netns_fl.run_testbed(row.scenario, sets, out, mbps=MBPS, delay_ms=0.0, keep=False,
                                   timeout_s=timeout_s, nodes=len(scen.node_names))
        latency_ms = bed["applied_delay_ms"] + bed["rtt_ms"] / 4
        net = [f"network.default={{up_mbps: {MBPS:g}, down_mbps: {MBPS:g}, latency_ms: {latency_ms:.4f}}}",
               *shared_cores(together)]
        emu = netns_fl.run_emu(row.scenario, sets + net, out / "emu-apriori", profile=profile)
        cmp = row.compare(read_events_partial(out / "real")[0], read_events_partial(out / "emu-apriori")[0])
        real_sha, emu_sha = bed["real_summary"].get("model_sha256"), emu.get("model_sha256")
        links = f"{MBPS:g} Mbit/s each way per rank, latency {latency_ms:.3f} ms per link"
        (out / "fidelity_row.json").write_text(json.dumps({"bed": bed, "emu_summary": emu, "compare": cmp},
                                                          indent=2, default=str))
    m = cmp["mean"]
    return {"row": name, "mode": row.mode, "scenario": row.scenario, "unit": row.unit,
            "units": len(cmp.get("rounds", cmp.get("steps", []))),
            "real_s": round(m["real_s"], 4), "emu_s": round(m["emu_s"], 4),
            "real_comm_s": round(m["real_comm_s"], 4), "emu_comm_s": round(m["emu_comm_s"], 4),
            "time_error": round((m["emu_s"] - m["real_s"]) / m["real_s"], 4),
            "comm_error": round((m["emu_comm_s"] - m["real_comm_s"]) / m["real_comm_s"], 4),
            # what is not communication: the slowest trainer's compute (DDP: compute and compression)
            "real_compute_s": round(m["real_s"] - m["real_comm_s"], 4), "emu_compute_s": round(m["emu_s"] - m["emu_comm_s"], 4),
            "abs_time_error_per_unit": _fraction(m["abs_error_pct"]),
            "abs_comm_error_per_unit": _fraction(m["abs_comm_error_pct"]),  # None: a unit had no comm
            "same_model": bool(real_sha) and real_sha == emu_sha, "links": links, "sets": sets,
            "calibrate_s": round(calibrate_s, 1), "calibrated_together": together, "out": str(out), "host": host(),
            "date": datetime.date.today().isoformat()}


def _fraction(pct: float) -> float | None:
    return None if pct != pct else round(pct / 100, 4)


def _drops(drops: dict) -> int:
    return sum(counts.get("UdpRcvbufErrors", 0) for counts in drops.values())


def host() -> str:
    from dtemu.host import profile as profiles

    m = profiles.machine()
    return f"{m['cpu']}, {os.cpu_count()} cores"


def markdown(records: list[dict]) -> str:
    lines = ["| row | unit | real s | emu s | time error | real comm s | emu comm s | comm error | "
             "real compute s | emu compute s | same model |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in records:
        real_c, emu_c = r["real_s"] - r["real_comm_s"], r["emu_s"] - r["emu_comm_s"]
        lines.append(f"| {r['row']} | {r['unit']} (x{r['units']}) | {r['real_s']:.3f} | "
                     f"{r['emu_s']:.3f} | {100 * r['time_error']:+.1f}% | {r['real_comm_s']:.3f} | "
                     f"{r['emu_comm_s']:.3f} | {100 * r['comm_error']:+.1f}% | {real_c:.3f} | {emu_c:.3f} | "
                     f"{'yes' if r['same_model'] else 'no'} |")
    return "\n".join(lines) + "\n"


def repeats(records_per_run: list[list[dict]]) -> str:
    """Each row's errors over several runs of this command (their JSON files): the spread."""
    rows: dict[str, list[dict]] = {}
    for records in records_per_run:
        for r in records:
            rows.setdefault(r["row"], []).append(r)
    lines = [f"| row | time error ({len(records_per_run)} runs) | comm error | real compute / emu compute |",
             "|---|---|---|---|"]

    def cell(values, pct=True):
        values = sorted(values)
        f = (lambda v: f"{100 * v:+.1f}%") if pct else (lambda v: f"{v:.2f}")
        return ", ".join(f(v) for v in values)
    for name, rs in rows.items():
        lines.append(f"| {name} | {cell(r['time_error'] for r in rs)} | {cell(r['comm_error'] for r in rs)} | "
                     f"{cell((r['real_compute_s'] / r['emu_compute_s'] for r in rs), pct=False)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fidelity", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated, of: " + ", ".join(ROWS))
    p.add_argument("--out", default=None, help="folder of the runs (default runs/fidelity-<time>)")
    p.add_argument("--json", default=None, help="write the records here (docs/fidelity.json)")
    p.add_argument("--md", default=None, help="write the table here")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--alone", action="store_true",
                   help="calibrate one rank alone (a machine of its own) instead of every training rank at once")
    p.add_argument("--repeats", nargs="+", metavar="JSON", help="no runs: the spread of several runs' records")
    args = p.parse_args(argv)
    if args.repeats:
        print(repeats([json.loads(Path(f).read_text()) for f in args.repeats]), end="")
        return 0
    ok, why = netns_fl.netns_available()
    if not ok:
        print(f"fidelity: {why}", file=sys.stderr)
        return 2
    names = [n for n in args.rows.split(",") if n]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        print(f"fidelity: unknown rows {unknown}; rows are {list(ROWS)}", file=sys.stderr)
        return 2
    out = Path(args.out or ROOT / "runs" / f"fidelity-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    records = []
    for name in names:
        t0 = time.monotonic()
        try:
            records.append(run_row(name, ROWS[name], out / name, args.timeout, together=not args.alone))
        except netns_fl.NetnsError as err:
            print(f"fidelity: {name}: {err}", file=sys.stderr)
            return 3
        print(f"fidelity: {name} in {time.monotonic() - t0:.0f} s: " + json.dumps(records[-1]), file=sys.stderr,
              flush=True)
        (out / "fidelity.json").write_text(json.dumps(records, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=2) + "\n")
    md = markdown(records)
    print(md)
    if args.md:
        Path(args.md).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
