"""GeoMX's training experiment in emu (issue 11): the four variants across WAN bandwidths.

    python -m tools.geo_sweep [--scenario scenarios/geo_hips.yaml] [--mbps 155,100,50,10]
                              [--variants none,fp16,bisparse,bisparse_fp16] [--flat] [--set KEY=VALUE ...]
                              --out DIR

Each run is ``emu run SCENARIO --set geo.compression=V`` with every site's WAN attachment (up and
down) at the bandwidth; ``--flat`` adds the flat-PS baseline (uncompressed) at each bandwidth.
Runs already in ``DIR`` (a ``summary.json``) are read, not run again.  It writes ``geo_sweep.md``
(time to each target, final accuracy, WAN bytes per WAN node and round up and down and as a
fraction of the dense model, the run's virtual length, and, per bandwidth, each time to the
highest target reached by both as a fraction of uncompressed HiPS) and ``geo_accuracy.png``
(accuracy over virtual time, one panel per bandwidth).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from dtemu.host.scenario_file import load_scenario


def run_one(scenario_path: str, out: Path, variant: str, mbps: float, arch: str, sets: list[str]) -> dict:
    folder = out / f"{arch}-{variant}-{mbps:g}"
    if (folder / "summary.json").exists():
        return json.loads((folder / "summary.json").read_text())
    base = load_scenario(scenario_path, sets)
    wan = [f"network.sites.{site}.wan.{k}={mbps:g}" for site in base.network.sites for k in ("up_mbps", "down_mbps")]
    sc = load_scenario(scenario_path, [*sets, f"geo.compression={variant}", f"geo.architecture={arch}", *wan])
    torch.set_num_threads(sc.threads)
    s = run_emulation(sc, folder)
    print(f"{folder.name}: acc {s['final_accuracy']}, time {s['time_s']:.2f} s, tta {s['time_to_accuracy']}, "
          f"wan up/down {s['wan']['up_ratio']}/{s['wan']['down_ratio']}", flush=True)
    return s


def history(folder: Path) -> list[tuple[float, float]]:
    return [(e["t"], e["accuracy"]) for e in read_events(folder) if e["kind"] == "eval"]


def table(runs: dict, mbps: list[float]) -> str:
    rows = ["| WAN Mbit/s | run | final accuracy | time to target (s) | WAN up / down per node and round (bytes) "
            "| up / down vs dense | virtual time (s) | time to target vs HiPS none |", "|---" * 8 + "|"]
    for bw in mbps:
        base = runs.get(("hips", "none", bw))
        for (arch, variant, b), s in runs.items():
            if b != bw:
                continue
            tta = s["time_to_accuracy"]
            tta_s = ", ".join(f"{k}: {'n/a' if v is None else f'{v:.2f}'}" for k, v in tta.items())
            rel = "n/a"
            if base is not None:
                common = [k for k in tta if tta[k] is not None and base["time_to_accuracy"].get(k) is not None]
                if common:
                    k = max(common, key=float)
                    rel = f"{tta[k] / base['time_to_accuracy'][k]:.2f} (at {k})"
            w = s["wan"]
            rows.append(f"| {bw:g} | {arch} {variant} | {s['final_accuracy']:.4f} | {tta_s} | "
                        f"{w['up_per_node_round']:.0f} / {w['down_per_node_round']:.0f} | "
                        f"{w['up_ratio']:.4f} / {w['down_ratio']:.4f} | {s['time_s']:.2f} | {rel} |")
    return "\n".join(rows) + "\n"


def figure(out: Path, runs: dict, mbps: list[float]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(mbps), 3.6))
    FigureCanvasAgg(fig)
    for i, bw in enumerate(mbps):
        ax = fig.add_subplot(1, len(mbps), i + 1)
        for (arch, variant, b) in runs:
            if b == bw:
                h = history(out / f"{arch}-{variant}-{bw:g}")
                ax.plot([t for t, _ in h], [a for _, a in h], label=f"{arch} {variant}", lw=1.2)
        ax.set_title(f"WAN {bw:g} Mbit/s")
        ax.set_xlabel("virtual time (s)")
        if i == 0:
            ax.set_ylabel("test accuracy")
        ax.set_ylim(0.5, None)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "geo_accuracy.png", dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="scenarios/geo_hips.yaml")
    ap.add_argument("--mbps", default="155,100,50,10")
    ap.add_argument("--variants", default="none,fp16,bisparse,bisparse_fp16")
    ap.add_argument("--flat", action="store_true", help="also the flat PS, uncompressed")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mbps = [float(b) for b in args.mbps.split(",")]
    runs = {}
    for bw in mbps:
        for v in args.variants.split(","):
            runs[("hips", v, bw)] = run_one(args.scenario, out, v, bw, "hips", args.sets)
        if args.flat:
            runs[("flat", "none", bw)] = run_one(args.scenario, out, "none", bw, "flat", args.sets)
    md = table(runs, mbps)
    (out / "geo_sweep.md").write_text(md)
    figure(out, runs, mbps)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
