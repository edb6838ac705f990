"""Write docs/results.md: the current headline tables, one per mode, plus performance and fidelity.

    python -m tools.results [--runs DIR] [--run] [--out docs/results.md]

Each shipped scenario's row comes from, in order:

1. a finished run folder ``DIR/<scenario>/`` (``summary.json``), such as
   ``python -m tools.pin_scenarios --out DIR`` or ``emu run ... --out DIR/<scenario>`` leave;
2. with ``--run``, a fresh ``emu run`` of it into ``DIR/<scenario>/`` (the whole set: about
   1.5 hours on 2 cores);
3. else the result pinned for this host's arithmetic (tests/pins.py), which the slow pin test
   checks; a scenario with neither says so.

Every row names its command and the host and arithmetic it ran under.  The comparisons
(DGC against dense, ESync against SSGD, BiSparse+FP16 and flat against HiPS) are computed from
those rows; fidelity is read from docs/fidelity.json where it exists.  What each number
meant when it was first measured, and everything else measured on the way, is in
docs/notebook/.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# section -> (scenario, what it shows), in the order the page lists them
SHIPPED = {
    "fl": [("fl_codecs", "2 clients, the 1.2M CNN, fp32 updates (the codec experiment's baseline)"),
           ("fl_straggler", "4 non-IID clients, one 4x slower, a slow uplink, dropouts, an offline window"),
           ("fl_faults", "every fault in one run: crashes at each protocol point, a partition, corrupt updates"),
           ("fl_1000", "1000 non-IID clients, 100 drawn per round")],
    "ddp": [("ddp_baseline", "3 workers, dense gradients, pipelined allreduce"),
            ("ddp_dgc", "the same with Deep Gradient Compression (0.1% after warm-up)"),
            ("ddp_worker_lost", "a worker crashes at 1 s; the others go on")],
    "esync": [("esync", "ESync (FL with its state server), 12 parties, 6 of them 150x slower"),
              ("ssgd_hetero", "SSGD on the same parties (FedAvg of one local step a round)")],
    "geo": [("geo_hips", "GeoMX HiPS, 2 sites x 4 workers, a 155 Mbit/s WAN, 1200 rounds"),
            ("geo_bisparse_fp16", "the same with BiSparse and FP16 on the WAN"),
            ("geo_flat", "the same workers on one flat parameter server")],
}
UNIT = {"fl": "rounds", "ddp": "steps", "esync": "rounds", "geo": "rounds"}


def pins():
    sys.path.insert(0, str(ROOT / "tests"))
    import pins as module  # noqa: E402  (tests/ is not a package)
    return module


def finished(folder: Path) -> dict | None:
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return None if summary.get("failed") else summary


def fresh(name: str, folder: Path) -> dict:
    from dtemu.emu.run import run_emulation
    from dtemu.host.scenario_file import load_scenario

    print(f"running {name} -> {folder}", file=sys.stderr, flush=True)
    return run_emulation(load_scenario(ROOT / "scenarios" / f"{name}.yaml"), folder)


def host_of(platform: dict) -> str:
    cpu = platform.get("cpu") or "host not recorded"
    return f"{cpu}, {platform.get('arith', '?')} `{platform.get('fingerprint', '?')}`"


def collect(runs: Path | None, run: bool) -> dict[str, dict]:
    """Each shipped scenario's row: its numbers, where they came from, the host."""
    from dtemu.host import cpu_arith

    p = pins()
    key = (cpu_arith.host_class(), cpu_arith.mode())
    rows = {}
    for mode, items in SHIPPED.items():
        for name, _ in items:
            folder = runs / name if runs else None
            summary = finished(folder) if folder else None
            if summary is None and run and folder is not None:
                summary = fresh(name, folder)
            if summary is not None:
                rows[name] = {"sha": summary["model_sha256"], "accuracy": summary["final_accuracy"],
                              "units": summary.get(UNIT[mode]), "up": summary["bytes_up"],
                              "down": summary["bytes_down"], "time_s": summary["time_s"],
                              "wall_s": summary.get("wall_time_s"), "wan": (summary.get("emu") or {}).get("wan_bytes"),
                              "tta": summary.get("time_to_accuracy") or {},
                              "source": "run", "host": host_of(summary.get("platform") or {})}
                continue
            pin = p.PINNED.get(key, {}).get(name)
            if pin is None:
                rows[name] = None
                continue
            sha, acc, units, up, down, time_s = pin
            rows[name] = {"sha": sha, "accuracy": acc, "units": units, "up": up, "down": down, "time_s": time_s,
                          "wall_s": None, "wan": None, "tta": {}, "source": "pin",
                          "host": p.HOSTS.get(key, "?")}
    return rows


def mode_table(mode: str, rows: dict) -> list[str]:
    unit = UNIT[mode]
    out = [f"| scenario | what it shows | {unit} | accuracy | virtual s | MB up | MB down | model | emu wall s | host |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, what in SHIPPED[mode]:
        r = rows.get(name)
        if r is None:
            out.append(f"| `emu run scenarios/{name}.yaml` | {what} | not measured on this host class |||||||")
            continue
        wall = "–" if r["wall_s"] is None else f"{r['wall_s']:.0f}"
        out.append(f"| `emu run scenarios/{name}.yaml` | {what} | {r['units']} | {r['accuracy']:.4f} | "
                   f"{r['time_s']:.1f} | {r['up'] / 1e6:,.1f} | {r['down'] / 1e6:,.1f} | `{r['sha'][:12]}` | {wall} | "
                   f"{r['host']}{' (pin)' if r['source'] == 'pin' else ''} |")
    return out


def comparisons(rows: dict) -> list[str]:
    """The headline claims, computed from the rows above."""
    out = ["| comparison | bytes | accuracy (points) | virtual time | time to the highest target both reach |",
           "|---|---|---|---|---|"]

    def line(label, a, b, bytes_of=lambda r: r["up"] + r["down"]):
        ra, rb = rows.get(a), rows.get(b)
        if not ra or not rb:
            out.append(f"| {label} | not measured ||||")
            return
        both = [t for t in ra["tta"] if ra["tta"].get(t) and rb["tta"].get(t)]
        target = max(both, key=float, default=None)
        tta = (f"{ra['tta'][target] / rb['tta'][target]:.3f}x (to {target}: {ra['tta'][target]:.1f} s "
               f"against {rb['tta'][target]:.1f} s)" if target else "– (no run folder, or no target reached by both)")
        out.append(f"| {label} | {bytes_of(ra) / bytes_of(rb):.3f}x | {100 * (ra['accuracy'] - rb['accuracy']):+.2f} | "
                   f"{ra['time_s'] / rb['time_s']:.3f}x | {tta} |")

    line("DGC against dense DDP (`ddp_dgc` / `ddp_baseline`)", "ddp_dgc", "ddp_baseline")
    line("ESync against SSGD (`esync` / `ssgd_hetero`; different round counts, see each row)", "esync", "ssgd_hetero")
    def wan(r):  # what crossed the WAN when the run folder says, else the training nodes' bytes
        return sum(v["up"] + v["down"] for v in r["wan"].values()) if r["wan"] else r["up"] + r["down"]

    geo_unit = "WAN bytes" if all((rows.get(n) or {}).get("wan") for n in ("geo_hips", "geo_bisparse_fp16")) else "bytes"
    line(f"BiSparse+FP16 against HiPS (`geo_bisparse_fp16` / `geo_hips`; {geo_unit})", "geo_bisparse_fp16",
         "geo_hips", wan)
    line(f"flat PS against HiPS (`geo_flat` / `geo_hips`; {geo_unit})", "geo_flat", "geo_hips", wan)
    return out


def performance(rows: dict, note: str = "") -> list[str]:
    timed = [(n, r) for n, r in rows.items() if r and r["wall_s"]]
    if not timed:
        return ["No run folder with wall times was given (`--runs DIR`): the pins carry no wall time."]
    out = ([note, ""] if note else []) + ["| scenario | emu wall s | virtual s | virtual s per wall s | host |",
                                          "|---|---|---|---|---|"]
    for name, r in timed:
        out.append(f"| `emu run scenarios/{name}.yaml` | {r['wall_s']:.0f} | {r['time_s']:.1f} | "
                   f"{r['time_s'] / r['wall_s']:.2f} | {r['host']} |")
    return out


def fidelity() -> list[str]:
    path = ROOT / "docs" / "fidelity.json"
    if not path.exists():
        return ["Not measured a priori yet (issue 28: `emu calibrate`, then emu against real runs over shaped "
                "network namespaces, the profile never taken from the run it predicts). What exists is emu "
                "replaying each real rank's measured compute: FL and DDP within 5% of communication and 3% of "
                "step time, geo within 10% with a factor from another run "
                "([notebook](notebook/2026-11-23-12-emu-against-real-fl-and-ddp-over-shaped-namespaces-issue-15.md), "
                "[geo](notebook/2026-11-24-19-geomx-issue-11-part-7-the-shipped-scenarios-at-1200-rounds-f.md)); "
                "those numbers are of their day."]
    rows = json.loads(path.read_text())
    out = ["A priori, for any scenario: `emu validate` calibrates under the testbed's CPU shares, predicts, runs the "
           "scenario on machines made on this box (`real launch --machines netns`) and compares unit by unit; "
           "`python -m tools.fidelity` does it for one row per mode. Targets: time within 10%, communication "
           "within 5%, in every repetition. What each miss measured is in [fidelity.md](fidelity.md).", "",
           "| row | time error (each run) | comm error (each run) | within targets | faithful | same model | host | date |",
           "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        recs = row["records"]
        pct = lambda x: "n/a" if x is None else f"{x:+.1%}"  # noqa: E731
        out.append(f"| {row['row']} | {', '.join(pct(r['time_error']) for r in recs)} | "
                   f"{', '.join(pct(r['comm_error']) for r in recs)} | {sum(bool(r['within_targets']) for r in recs)} "
                   f"of {len(recs)} | {sum(bool(r['faithful']) for r in recs)} of {len(recs)} | "
                   f"{'yes' if all(r['same_model'] for r in recs) else 'no'} | {row['host']} | {row['date']} |")
    return out


def page(rows: dict, command: str, note: str = "") -> str:
    p = pins()
    parts = [
        "# Results", "",
        f"*Generated by `{command}` on {time.strftime('%Y-%m-%d')}; do not edit by hand. Everything measured on "
        "the way, with its day's commands and hosts, is in [notebook/](notebook/README.md).*", "",
        "emu's times are virtual: they follow from the scenario's network and compute models, not from the "
        "machine's speed. A row marked *(pin)* is the result pinned for that host class's arithmetic "
        "(tests/pins.py), which `pytest -m slow tests/test_shipped_scenarios.py` checks; the others come "
        "from the run folders named in the command. Accuracy is on each scenario's test set "
        "(`data.test_samples`, else all of it).", "",
    ]
    titles = {"fl": "Federated learning", "ddp": "Data-parallel training", "esync": "ESync and SSGD (once mode ps)",
              "geo": "Across data centres (GeoMX)"}
    for mode in SHIPPED:
        parts += [f"## {titles[mode]}", "", *mode_table(mode, rows), ""]
    parts += ["## What the comparisons come to", "",
              "Ratios of the rows above (bytes: up and down at the training nodes; a negative accuracy "
              "difference is the first scenario's loss).", "", *comparisons(rows), ""]
    parts += ["## Performance", "", *performance(rows, note), "",
              "The benchmarks of the tools (`python -m tools.bench_*`: the arithmetic settings' cost, the tasks' "
              "samples per second against a bare loop, real mode's speed) are in [notebook/](notebook/README.md), "
              "each with its command and host.", ""]
    parts += ["## Fidelity: emu against real runs", "", *fidelity(), ""]
    parts += ["## The same model on another host", "",
              "A scenario's model is the same on every host of the same class under the same arithmetic "
              "(README, \"The same seed, the same model\"). The pins exist for:", "",
              "| host class, setting | what made them |", "|---|---|",
              *(f"| {cls}, {setting} | {what} |" for (cls, setting), what in p.HOSTS.items()), ""]
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", help="run folders, one per shipped scenario (DIR/<scenario>/)")
    ap.add_argument("--run", action="store_true", help="run the scenarios that have no folder in --runs")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results.md"))
    ap.add_argument("--note", default="", help="said above the performance table (how the box was loaded)")
    args = ap.parse_args(argv)
    if args.run and not args.runs:
        ap.error("--run needs --runs DIR (where the fresh runs go)")
    rows = collect(Path(args.runs) if args.runs else None, args.run)
    command = "python -m tools.results" + (f" --runs {args.runs}" if args.runs else "") + (" --run" if args.run else "")
    Path(args.out).write_text(page(rows, command, args.note) + "\n")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
