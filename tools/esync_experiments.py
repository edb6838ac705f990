"""ESync's experiments (issue 10), in emu, with the small CNN on Fashion-MNIST.

    python -m tools.esync_experiments headline    # ESync vs SSGD: time to 0.8 at h_c = 150 and at h_c = 1
    python -m tools.esync_experiments hc          # time to 0.8 against h_c (ESync and SSGD)
    python -m tools.esync_experiments noniid      # ESync, SSGD, ASGD, DC-ASGD on non-IID shards (h_c = 150)
    python -m tools.esync_experiments baselines   # accuracy over time for every algorithm (h_c = 150)
    python -m tools.esync_experiments centralized # centralized SGD (one party, all the data): the accuracy reference
    python -m tools.esync_experiments feddrop     # FedDrop's final test loss against K_hat
    python -m tools.esync_experiments cnn4 [headline|fedasync|noniid|hc]  # the larger model (4 conv + 1 FC)

Every run starts from scenarios/esync.yaml (12 parties, 6 fast and 6 slow, 1 Gbit/s LAN,
IID Fashion-MNIST, batch 32, SGD) in the ps form these experiments were written in (``BASE_PS``,
read as FL's: core.fl.ps_form), with the overrides each experiment lists (``ps.*``), runs in
virtual time under /tmp/esync_experiments/<label>, and its numbers (summary and the
parameter server's evaluations) go to docs/figures/esync/<experiment>.json with a
figure beside.  Run one at a time under flock /tmp/dtemu-heavy.lock: each is minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "scenarios" / "esync.yaml"
# scenarios/esync.yaml as it was, in mode ps's keys (its network, data and speeds are the file's)
BASE_PS = {"mode": "ps", "ps": {"workers": 12, "algorithm": "esync", "rounds": 20, "batch_size": 32, "lr": 0.05,
                                "global_lr": 1.0, "init": "xavier", "eval_every": 1, "round_timeout_s": 60,
                                "min_workers": 6}}
FIGURES = ROOT / "docs" / "figures" / "esync"
SLOW = [f"worker{k}" for k in range(7, 13)]


def speeds(hc: float) -> list[str]:
    return [f"compute.nodes.{w}.slowdown={hc}" for w in SLOW]


def run(label: str, overrides: list[str]) -> dict:
    from dtemu.core.errors import DtemuError
    from dtemu.emu.run import run_emulation
    from dtemu.host.rundir import read_events
    from dtemu.core import bounded_yaml
    from dtemu.core.scenario import parse_scenario

    raw = bounded_yaml.load(BASE.read_text(), str(BASE))
    raw.pop("fl")
    raw["compute"]["nodes"] = {w: {"slowdown": 150} for w in SLOW}
    scenario = parse_scenario({**raw, **BASE_PS}, overrides)
    out = Path("/tmp/esync_experiments") / label
    started = time.perf_counter()
    try:
        summary = run_emulation(scenario, out)
    except DtemuError as err:  # e.g. a run that diverged: every worker's update not finite, nothing left to do
        events = read_events(out)
        evals = [(e["t"], e["accuracy"], e.get("loss")) for e in events if e["kind"] == "eval"]
        bad = [e["t"] for e in events if e["kind"] == "update_not_finite"]
        print(f"{label}: failed: {err}", flush=True)
        return {"label": label, "overrides": overrides, "error": str(err), "evals": evals,
                "first_not_finite_s": min(bad) if bad else None, "updates_not_finite": len(bad),
                "time_to_accuracy": {}, "wall_s": round(time.perf_counter() - started, 1)}
    evals = [(e["t"], e["accuracy"], e.get("loss")) for e in read_events(out) if e["kind"] == "eval"]
    keep = ("algorithm", "time_s", "rounds", "final_accuracy", "final_loss", "time_to_accuracy", "model_sha256",
            "stop_reason",
            "bytes_up", "bytes_down",
            "blocking_time_s", "iterations_per_round", "samples_per_s", "updates")
    row = {"label": label, "overrides": overrides, **{k: summary.get(k) for k in keep},
           "wall_s": round(time.perf_counter() - started, 1), "evals": evals}
    print(f"{label}: t={summary['time_s']:.2f}s acc={summary['final_accuracy']} "
          f"tta={summary['time_to_accuracy']} wall={row['wall_s']}s", flush=True)
    return row


def _load(name: str) -> list[dict]:
    path = FIGURES / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else []


def save(name: str, rows: list[dict]) -> None:
    FIGURES.mkdir(parents=True, exist_ok=True)
    (FIGURES / f"{name}.json").write_text(json.dumps(rows, indent=1))


def curves(name: str, rows: list[dict], title: str, logx: bool = True) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in rows:
        t = [max(e[0], 1e-3) for e in r["evals"]]
        ax.plot(t, [e[1] for e in r["evals"]], label=r["label"], lw=1.4)
    if logx:
        ax.set_xscale("log")
    ax.axhline(0.8, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("virtual time (s)" + (", log scale" if logx else ""))
    ax.set_ylabel("test accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURES / f"{name}.png", dpi=110)
    plt.close(fig)


def headline() -> list[dict]:
    rows = [run("esync-hc150", []), run("ssgd-hc150", ["ps.algorithm=ssgd", "ps.rounds=1000", "ps.eval_every=10"])]
    rows += [run("esync-hc1", speeds(1) + ["ps.rounds=1000", "ps.eval_every=10"]),
             run("ssgd-hc1", speeds(1) + ["ps.algorithm=ssgd", "ps.rounds=1000", "ps.eval_every=10"])]
    save("headline", rows)
    curves("headline", rows, "ESync vs SSGD, 12 parties (6 slow), small CNN, Fashion-MNIST")
    return rows


# ESync's rounds at each h_c: enough to pass 0.8 (a round's fast iterations grow with h_c, so
# fewer rounds are needed as h_c grows); SSGD's trajectory does not depend on h_c (one
# iteration a party a round), it passes 0.8 near round 190, so 300 rounds suffice.
HC_ESYNC_ROUNDS = {10: 60, 50: 25, 300: 8}
HC_SSGD_ROUNDS = 300


def hc() -> list[dict]:
    """Time to 0.8 against h_c; h_c = 1 and 150 are the headline's runs (the same scenarios), reused."""
    done = {r["label"]: r for r in _load("headline") + _load("hc")}
    rows = []
    for h in sorted({1, 150, *HC_ESYNC_ROUNDS}):
        for algo in ("esync", "ssgd"):
            label = f"{algo}-hc{h}"
            if label not in done:
                rounds = HC_ESYNC_ROUNDS[h] if algo == "esync" else HC_SSGD_ROUNDS
                o = speeds(h) + [f"ps.rounds={rounds}"] + (["ps.algorithm=ssgd", "ps.eval_every=10"]
                                                             if algo == "ssgd" else [])
                done[label] = run(label, o)
            rows.append(done[label])
            save("hc", rows)  # as far as it got
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo in ("esync", "ssgd"):
        pts = [(int(r["label"].split("hc")[1]), r["time_to_accuracy"].get("0.8")) for r in rows
               if r["label"].startswith(algo)]
        ax.plot([h for h, t in pts if t], [t for h, t in pts if t], "o-", label=algo)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("h_c (slow parties' slowdown)")
    ax.set_ylabel("virtual seconds to 0.8 test accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(FIGURES / "hc.png", dpi=110)
    plt.close(fig)
    return rows


def noniid() -> list[dict]:
    """ESync, SSGD, ASGD and DC-ASGD at h_c = 150 on non-IID data (McMahan's shards: 2 a party,
    so a party holds at most 4 labels, and the slow parties hold labels the fast ones lack)."""
    runs = {
        "esync": ["ps.rounds=60"],
        "ssgd": ["ps.algorithm=ssgd", "ps.rounds=400", "ps.eval_every=10"],
        "asgd": ["ps.algorithm=asgd", "ps.rounds=6000", "ps.eval_every=200"],
        "dcasgd": ["ps.algorithm=dcasgd", "ps.rounds=6000", "ps.eval_every=200"],
        # ESync on until SSGD's time to 0.8 (72.0 s): does it get there first?
        "esync-to72s": ["ps.rounds=100000", "ps.max_time_s=72.03"],
        # The same with a fast party's local iterations capped at 32 a round (a quarter of what fit)
        # against the drift on its few labels that made the run above swing after 0.8.
        "esync-cap32-to72s": ["ps.rounds=100000", "ps.max_time_s=72.03", "ps.max_local_iterations=32"],
        # ASGD and DC-ASGD diverge at the scenario's lr 0.05 on the shards; at 0.02 (the largest tried
        # that held for 6000 updates) they run, for 40 s: does their early lead last?
        "asgd-lr0.02-to40s": ["ps.algorithm=asgd", "ps.lr=0.02", "ps.rounds=1000000", "ps.max_time_s=40",
                              "ps.eval_every=500"],
        "dcasgd-lr0.02-to40s": ["ps.algorithm=dcasgd", "ps.lr=0.02", "ps.rounds=1000000", "ps.max_time_s=40",
                                "ps.eval_every=500"],
        # ESync at that lr too (its fast parties' drift on their few labels shrinks with it)
        "esync-lr0.02-to40s": ["ps.lr=0.02", "ps.rounds=100000", "ps.max_time_s=40"],
    }
    done = {r["label"]: r for r in _load("noniid")}
    rows = []
    for label, o in runs.items():
        label = f"{label}-noniid"
        o = ["data.partition=shards", "data.shards_per_client=2"] + o
        cached = done.get(label)
        # (a run that failed is run again: ASGD's divergence used to end in an error, now in a stop_reason)
        rows.append(cached if cached and cached["overrides"] == o and "error" not in cached else run(label, o))
        save("noniid", rows)  # as far as it got
    curves("noniid", rows, "non-IID (2 shards a party), h_c = 150 (each run to its own budget)")
    return rows


def centralized() -> list[dict]:
    """Centralized SGD, the accuracy reference: one party holding the whole training set, at the
    fast parties' speed, one epoch a round (FedAvg with one worker: w + delta is plain SGD), 8
    epochs (ESync's 20 rounds at h_c = 150 trained on ~7.9 epochs' worth of samples)."""
    rows = [run("centralized-sgd", ["ps.workers=1", "ps.min_workers=1", "ps.tifl_tiers=1", "compute.nodes={}",
                                    "ps.algorithm=fedavg", "ps.local_epochs=1", "ps.rounds=8"])]
    save("centralized", rows)
    return rows


def baselines() -> list[dict]:
    runs = {
        "esync": ["ps.rounds=20"],
        "ssgd": ["ps.algorithm=ssgd", "ps.rounds=1000", "ps.eval_every=10"],
        "asgd": ["ps.algorithm=asgd", "ps.rounds=6000", "ps.eval_every=200"],
        "dcasgd": ["ps.algorithm=dcasgd", "ps.rounds=6000", "ps.eval_every=200"],
        "fedavg": ["ps.algorithm=fedavg", "ps.rounds=5"],
        "fedasync+poly": ["ps.algorithm=fedasync", "ps.staleness=poly", "ps.rounds=60", "ps.eval_every=4"],
        "fedasync+hinge": ["ps.algorithm=fedasync", "ps.staleness=hinge", "ps.rounds=60", "ps.eval_every=4"],
        "feddrop(6)": ["ps.algorithm=feddrop", "ps.feddrop_k_hat=6", "ps.rounds=10"],
        "tifl": ["ps.algorithm=tifl", "ps.tifl_tier_probs=[0.5,0.5]", "ps.tifl_credits=[100,3]", "ps.rounds=10"],
    }
    # ESync and SSGD at h_c = 150 are the headline's runs (the same scenarios): reused when there.
    done = {r["label"].split("-hc")[0]: r for r in _load("headline") if r["label"].endswith("-hc150")}
    rows = []
    for label, o in runs.items():
        rows.append(dict(done[label], label=label) if label in done else run(label, o))
        save("baselines", rows)  # as far as it got
    curves("baselines", rows, "every algorithm, h_c = 150 (each run to its own budget)")
    return rows


def feddrop() -> list[dict]:
    import sys as _sys

    ks = [int(k) for k in _sys.argv[2:]] or [4, 6, 8, 10]
    done = {r["label"]: r for r in _load("feddrop")}
    rows = [done.get(f"feddrop-k{k}") or run(f"feddrop-k{k}", ["ps.algorithm=feddrop", f"ps.feddrop_k_hat={k}",
                                                                "ps.rounds=8"]) for k in ks]
    rows = sorted({**done, **{r["label"]: r for r in rows}}.values(), key=lambda r: int(r["label"].split("-k")[1]))
    save("feddrop", rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot([int(r["label"].split("-k")[1]) for r in rows], [r["final_loss"] for r in rows], "o-")
    ax.set_xlabel("K_hat (workers not waited for)")
    ax.set_ylabel("final test loss")
    fig.tight_layout()
    fig.savefig(FIGURES / "feddrop.png", dpi=110)
    plt.close(fig)
    return rows


# The larger model (core.ml.models.Cnn4: four 3x3 convolutions and one fully connected layer, the
# shape of FedAsync's CNN, 32,058 parameters, ~3.2x small_cnn's step).  "headline": ESync against
# SSGD at h_c = 150.  "fedasync": FedAsync (+Poly, a = 0.5) against FedAvg over the same span of
# virtual time; an epoch a round at h_c = 150 is beyond this machine (FedAsync's fast parties train
# all the time: ~900 fast iterations per slow one), so rounds are 20 local iterations and h_c = 20
# (a FedAvg round: 20 slow iterations, 3.2 s); "noniid": the same on McMahan's shards.
CNN4_RUNS = {
    "headline": {
        "esync-cnn4-hc150": ["model=cnn4", "ps.rounds=10"],
        "ssgd-cnn4-hc150": ["model=cnn4", "ps.algorithm=ssgd", "ps.rounds=600", "ps.eval_every=10"],
    },
    "fedasync": {
        "fedavg-cnn4-hc20": ["model=cnn4", *speeds(20), "ps.algorithm=fedavg", "ps.fixed_iterations=20",
                             "ps.rounds=15"],
        "fedasync-cnn4-hc20": ["model=cnn4", *speeds(20), "ps.algorithm=fedasync", "ps.staleness=poly",
                               "ps.fixed_iterations=20", "ps.rounds=100000", "ps.max_time_s=48",
                               "ps.eval_every=60"],
    },
    "noniid": {
        "fedavg-cnn4-hc20-noniid": ["model=cnn4", *speeds(20), "data.partition=shards", "ps.algorithm=fedavg",
                                    "ps.fixed_iterations=20", "ps.rounds=15"],
        "fedasync-cnn4-hc20-noniid": ["model=cnn4", *speeds(20), "data.partition=shards", "ps.algorithm=fedasync",
                                      "ps.staleness=poly", "ps.fixed_iterations=20", "ps.rounds=100000",
                                      "ps.max_time_s=48", "ps.eval_every=60"],
    },
}
# "hc": ESync against SSGD across h_c (h_c = 150 is the headline's pair, reused).  Budgets past 0.8:
# ESync's rounds shrink as h_c grows (a round holds ~0.8 h_c fast iterations); at h_c = 1 ESync runs
# as SSGD does, one iteration a party a round.  SSGD's model does not depend on h_c (it passes 0.8
# near its round 220 at h_c = 150), only its time does, so 400 rounds each.
CNN4_HC_ESYNC_ROUNDS = {1: 400, 10: 100, 50: 25, 300: 8}
CNN4_RUNS["hc"] = {}
for _h, _rounds in CNN4_HC_ESYNC_ROUNDS.items():
    CNN4_RUNS["hc"][f"esync-cnn4-hc{_h}"] = ["model=cnn4", *speeds(_h), f"ps.rounds={_rounds}",
                                              *(["ps.eval_every=10"] if _h == 1 else [])]
    CNN4_RUNS["hc"][f"ssgd-cnn4-hc{_h}"] = ["model=cnn4", *speeds(_h), "ps.algorithm=ssgd", "ps.rounds=400",
                                             "ps.eval_every=10"]


def cnn4_hc_figure(done: dict) -> None:
    """Time to 0.8 against h_c, cnn4 beside small_cnn (docs/figures/esync/hc.json)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    small = {r["label"]: r for r in _load("headline") + _load("hc")}
    fig, ax = plt.subplots(figsize=(6, 4))
    for model, rows, style in (("cnn4", done, "-"), ("small_cnn", small, "--")):
        for algo in ("esync", "ssgd"):
            pts = []
            for h in (1, 10, 50, 150, 300):
                r = rows.get(f"{algo}-cnn4-hc{h}" if model == "cnn4" else f"{algo}-hc{h}")
                t = r and r["time_to_accuracy"].get("0.8")
                if t:
                    pts.append((h, t))
            ax.plot([h for h, _ in pts], [t for _, t in pts], "o" + style, label=f"{algo}, {model}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("h_c (slow parties' slowdown)")
    ax.set_ylabel("virtual seconds to 0.8 test accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURES / "cnn4_hc.png", dpi=110)
    plt.close(fig)


def cnn4() -> list[dict]:
    # The values are parts, or single run labels (one run per call: flock it run by run).
    labels = {label for runs in CNN4_RUNS.values() for label in runs}
    only = [v for v in sys.argv[2:] if v in labels]
    parts = [v for v in sys.argv[2:] if v in CNN4_RUNS] or [p for p, runs in CNN4_RUNS.items()
                                                             if not only or set(only) & set(runs)]
    done = {r["label"]: r for r in _load("cnn4")}
    for part in parts:
        for label, o in CNN4_RUNS[part].items():
            if only and label not in only:
                continue
            cached = done.get(label)
            if not (cached and cached["overrides"] == o):
                done[label] = run(label, o)
            save("cnn4", list(done.values()))  # as far as it got
    rows = list(done.values())
    if "hc" in parts:
        cnn4_hc_figure(done)
    for part, runs in CNN4_RUNS.items():
        if part == "hc":
            continue
        shown = [done[label] for label in runs if label in done]
        if shown:
            curves(f"cnn4_{part}", shown, f"cnn4 (4 conv + 1 FC): {part}")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", choices=("headline", "hc", "noniid", "centralized", "baselines", "feddrop", "cnn4"))
    p.add_argument("values", nargs="*", help="feddrop: the K_hat values to (re)run (default 4 6 8 10); "
                                             "cnn4: the parts to run (headline, fedasync, noniid, hc; default all), or single run labels")
    args = p.parse_args()
    globals()[args.experiment]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
