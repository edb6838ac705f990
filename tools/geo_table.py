"""Per-round communication time of HiPS against a flat parameter server (issue 11, GeoMX's Table 1).

    python -m tools.geo_table [--params 11.17,21.27,23.49,42.46] [--mbps 1000,155]
                              [--workers-per-site 4] [--rounds 2] --out DIR

No training: for each model size P (millions of parameters) and each WAN bandwidth this runs the
real geo roles (``core.geo.roles``: master, workers, local PSs, global or flat PS, in emu over
``emu.network`` with sites) on a synthetic model, one float32 tensor of P·10^6 entries, whose
"gradient" costs no modelled time.  The testbed is the design's, in small: a central site (master,
global or flat PS) and two sites of ``--workers-per-site`` workers, 1 Gbit/s LANs (0.1 ms), every
site's WAN attachment at the given bandwidth (1 ms).  The number is the length of a round: the
virtual time between the root PS closing the last two rounds (its ``geo_round`` events, after it
sent the aggregate down), i.e. workers' pushes over the LANs and the WAN, the sum, and the pull back
to the last worker; dense fp32, FSA.

It writes ``geo_table.json``, ``geo_table.md`` (the table, and each HiPS-at-155 / flat-at-1G ratio)
and ``geo_table.png`` into ``--out``.

Cost: every role holds the model (a 42.46 M model is 170 MB a copy, about 20 copies alive at once
for the flat PS): a few GB and about 4 minutes for the default table on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dtemu.core.scenario import parse_scenario
from dtemu.emu.run import run_emulation


class _Flat(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n))


class _Labels:
    def __init__(self, n: int):
        self.y_train = torch.zeros(n, dtype=torch.long)


class SyntheticWork:
    """What the geo roles use of a Workload, for a model of ``n`` parameters and no data: the
    gradient is a constant (no modelled compute), evaluation is a stub."""

    test_size = 1

    def __init__(self, n: int, samples: int):
        self.n = n
        self.grad = torch.full((n,), 1e-3)  # one tensor for every worker: memory, not correctness
        self.dataset = _Labels(samples)
        self.reference_cost = 1e-12

    def new_model(self):
        return _Flat(self.n)

    def gradients(self, model, batch, rank, step):
        model.weight.grad = self.grad
        return 0.0

    def split(self, parties):  # Workload.split for these scenarios' data (iid, seed 1)
        from dtemu.core.ml.data import partition

        return partition("iid", self.dataset.y_train.numpy(), parties, seed=1)

    def evaluate_shard(self, model, rank, world):
        return 0, 1


def scenario(architecture: str, mbps: float, workers_per_site: int, rounds: int):
    site = {"lan": {"bandwidth_mbps": 1000, "latency_ms": 0.1},
            "wan": {"up_mbps": mbps, "down_mbps": mbps, "latency_ms": 1}}
    return parse_scenario({
        "name": f"geo-table-{architecture}-{mbps:g}", "mode": "geo", "seed": 1, "threads": 2,
        "network": {"central": "central", "sites": {"central": site, "a": site, "b": site}},
        "geo": {"architecture": architecture, "workers_per_site": workers_per_site, "rounds": rounds,
                "batch_size": 1, "momentum": 0.0, "eval_every": 10 ** 6, "round_timeout_s": 3600},
    })


def measure(params_m: float, architecture: str, mbps: float, workers_per_site: int, rounds: int) -> float:
    n = int(round(params_m * 1e6))
    sc = scenario(architecture, mbps, workers_per_site, rounds)
    with tempfile.TemporaryDirectory() as tmp:
        s = run_emulation(sc, Path(tmp) / "run", work=SyntheticWork(n, 2 * workers_per_site * 4))
        assert s["stop_reason"] == "done", s["stop_reason"]
        root = sc.node_names[1]
        closes = [e["t"] for e in map(json.loads, (Path(tmp) / "run" / "events.jsonl").open())
                  if e["kind"] == "geo_round" and e["node"] == root]
    return closes[-1] - closes[-2]


def table(params: list[float], mbps: list[float], workers_per_site: int, rounds: int) -> list[dict]:
    rows = []
    for p in params:
        row = {"params_m": p}
        for arch in ("hips", "flat"):
            for bw in mbps:
                row[f"{arch}_{bw:g}"] = round(measure(p, arch, bw, workers_per_site, rounds), 4)
                print(f"{p} M, {arch}, {bw:g} Mbit/s: {row[f'{arch}_{bw:g}']} s", flush=True)
        rows.append(row)
    return rows


def markdown(rows: list[dict], mbps: list[float]) -> str:
    cols = [f"{a}_{b:g}" for a in ("hips", "flat") for b in mbps]
    names = {f"{a}_{b:g}": f"{'HiPS' if a == 'hips' else 'flat PS'} {b:g} Mbit/s" for a in ("hips", "flat")
             for b in mbps}
    lo, hi = min(mbps), max(mbps)
    out = ["| parameters (M) | " + " | ".join(names[c] + " (s)" for c in cols)
           + f" | HiPS {lo:g} / flat {hi:g} |", "|---" * (len(cols) + 2) + "|"]
    for r in rows:
        ratio = r[f"hips_{lo:g}"] / r[f"flat_{hi:g}"]
        out.append(f"| {r['params_m']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + f" | {ratio:.2f} |")
    return "\n".join(out) + "\n"


def figure(rows: list[dict], mbps: list[float], path: Path, workers_per_site: int) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    cols = [(a, b) for a in ("hips", "flat") for b in sorted(mbps, reverse=True)]
    width = 0.8 / len(cols)
    for i, (a, b) in enumerate(cols):
        ax.bar(x + (i - (len(cols) - 1) / 2) * width, [r[f"{a}_{b:g}"] for r in rows], width,
               label=f"{'HiPS' if a == 'hips' else 'flat PS'} {b:g} Mbit/s WAN")
    ax.set_xticks(x, [f"{r['params_m']} M" for r in rows])
    ax.set_ylabel("round time, no compute (s, emu)")
    ax.set_title(f"HiPS vs flat PS, 2 sites x {workers_per_site} workers, dense fp32")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="11.17,21.27,23.49,42.46", help="model sizes, millions of parameters")
    ap.add_argument("--mbps", default="1000,155", help="WAN bandwidths (every site's attachment), Mbit/s")
    ap.add_argument("--workers-per-site", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="at least 2: a round is the time between two closes")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    params = [float(p) for p in args.params.split(",")]
    mbps = [float(b) for b in args.mbps.split(",")]
    rows = table(params, mbps, args.workers_per_site, args.rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "geo_table.json").write_text(json.dumps({"workers_per_site": args.workers_per_site,
                                                    "rounds": args.rounds, "rows": rows}, indent=1))
    (out / "geo_table.md").write_text(markdown(rows, mbps))
    figure(rows, mbps, out / "geo_table.png", args.workers_per_site)
    print(markdown(rows, mbps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
