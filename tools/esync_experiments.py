"""ESync's experiments (issue 10), in emu, with the small CNN on Fashion-MNIST.

    python -m tools.esync_experiments headline    # ESync vs SSGD: time to 0.8 at h_c = 150 and at h_c = 1
    python -m tools.esync_experiments hc          # time to 0.8 against h_c (ESync and SSGD)
    python -m tools.esync_experiments noniid      # ESync, SSGD, ASGD, DC-ASGD on non-IID shards (h_c = 150)
    python -m tools.esync_experiments baselines   # accuracy over time for every algorithm (h_c = 150)
    python -m tools.esync_experiments centralized # centralized SGD (one party, all the data): the accuracy reference
    python -m tools.esync_experiments feddrop     # FedDrop's final test loss against K_hat
    python -m tools.esync_experiments cnn4 [headline|fedasync|noniid|hc]  # the larger model (4 conv + 1 FC)

Every run starts from scenarios/esync.yaml (12 clients, 6 fast and 6 slow, 1 Gbit/s LAN,
IID Fashion-MNIST, batch 32, SGD, ESync's rule), with the overrides each experiment lists in FL's
keys, runs in virtual time under /tmp/esync_experiments/<label>, and its numbers (summary and the
controller's evaluations) go to docs/figures/esync/<experiment>.json with a figure beside.

The baselines are FL rules: SSGD is FedAvg over one batch a round (``fl.subset`` of one batch, drawn
each round), ASGD and DC-ASGD take one batch a client too, and a fixed schedule of k iterations is
``fl.subset`` of k batches.  (These experiments were first written in mode ps's keys, which
core/fl/ps_form.py still reads as this form.)  Run one at a time under flock /tmp/dtemu-heavy.lock: each is minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "scenarios" / "esync.yaml"
FIGURES = ROOT / "docs" / "figures" / "esync"
SLOW = [f"client{k}" for k in range(7, 13)]
BATCH = 32   # scenarios/esync.yaml's fl.batch_size


def iterations(k: int) -> str:
    """k local iterations a round: k batches, drawn afresh each round."""
    return f"fl.subset={k * BATCH}"


# The rules, each as FL spells it (ESync is the file's own).
SSGD = ["fl.algorithm=fedavg", iterations(1)]
ASGD = ["fl.algorithm=asgd", iterations(1)]
DCASGD = ["fl.algorithm=dcasgd", iterations(1)]


def speeds(hc: float) -> list[str]:
    return [f"compute.nodes.{w}.slowdown={hc}" for w in SLOW]


def run(label: str, overrides: list[str]) -> dict:
    from dtemu.core.errors import DtemuError
    from dtemu.emu.run import run_emulation
    from dtemu.host.rundir import read_events
    from dtemu.core import bounded_yaml
    from dtemu.core.scenario import parse_scenario

    raw = bounded_yaml.load(BASE.read_text(), str(BASE))
    scenario = parse_scenario(raw, overrides)
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


HEADLINE_RUNS = {
    "esync-hc150": [],
    "ssgd-hc150": [*SSGD, "fl.rounds=1000", "fl.eval_every=10"],
    "esync-hc1": speeds(1) + ["fl.rounds=1000", "fl.eval_every=10"],
    "ssgd-hc1": speeds(1) + [*SSGD, "fl.rounds=1000", "fl.eval_every=10"],
}


def headline() -> list[dict]:
    rows = [run(label, o) for label, o in HEADLINE_RUNS.items()]
    save("headline", rows)
    curves("headline", rows, "ESync vs SSGD, 12 parties (6 slow), small CNN, Fashion-MNIST")
    return rows


# ESync's rounds at each h_c: enough to pass 0.8 (a round's fast iterations grow with h_c, so
# fewer rounds are needed as h_c grows); SSGD's trajectory does not depend on h_c (one
# iteration a party a round), it passes 0.8 near round 190, so 300 rounds suffice.
HC_ESYNC_ROUNDS = {10: 60, 50: 25, 300: 8}
HC_SSGD_ROUNDS = 300


def hc_run(algo: str, h: float) -> list[str]:
    rounds = HC_ESYNC_ROUNDS[h] if algo == "esync" else HC_SSGD_ROUNDS
    return speeds(h) + [f"fl.rounds={rounds}"] + ([*SSGD, "fl.eval_every=10"] if algo == "ssgd" else [])


def hc() -> list[dict]:
    """Time to 0.8 against h_c; h_c = 1 and 150 are the headline's runs (the same scenarios), reused."""
    done = {r["label"]: r for r in _load("headline") + _load("hc")}
    rows = []
    for h in sorted({1, 150, *HC_ESYNC_ROUNDS}):
        for algo in ("esync", "ssgd"):
            label = f"{algo}-hc{h}"
            if label not in done:
                done[label] = run(label, hc_run(algo, h))
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


NONIID_RUNS = {
    "esync": ["fl.rounds=60"],
    "ssgd": [*SSGD, "fl.rounds=400", "fl.eval_every=10"],
    "asgd": [*ASGD, "fl.rounds=6000", "fl.eval_every=200"],
    "dcasgd": [*DCASGD, "fl.rounds=6000", "fl.eval_every=200"],
    # ESync on until SSGD's time to 0.8 (72.0 s): does it get there first?
    "esync-to72s": ["fl.rounds=100000", "fl.max_time_s=72.03"],
    # The same with a fast party's local iterations capped at 32 a round (a quarter of what fit)
    # against the drift on its few labels that made the run above swing after 0.8.
    "esync-cap32-to72s": ["fl.rounds=100000", "fl.max_time_s=72.03", "fl.esync.max_iterations=32"],
    # ASGD and DC-ASGD diverge at the scenario's lr 0.05 on the shards; at 0.02 (the largest tried
    # that held for 6000 updates) they run, for 40 s: does their early lead last?
    "asgd-lr0.02-to40s": [*ASGD, "fl.lr=0.02", "fl.rounds=1000000", "fl.max_time_s=40",
                          "fl.eval_every=500"],
    "dcasgd-lr0.02-to40s": [*DCASGD, "fl.lr=0.02", "fl.rounds=1000000", "fl.max_time_s=40",
                            "fl.eval_every=500"],
    # ESync at that lr too (its fast parties' drift on their few labels shrinks with it)
    "esync-lr0.02-to40s": ["fl.lr=0.02", "fl.rounds=100000", "fl.max_time_s=40"],
}
NONIID_DATA = ["data.partition=shards", "data.shards_per_client=2"]


def noniid() -> list[dict]:
    """ESync, SSGD, ASGD and DC-ASGD at h_c = 150 on non-IID data (McMahan's shards: 2 a party,
    so a party holds at most 4 labels, and the slow parties hold labels the fast ones lack)."""
    done = {r["label"]: r for r in _load("noniid")}
    rows = []
    for label, o in NONIID_RUNS.items():
        label = f"{label}-noniid"
        o = NONIID_DATA + o
        cached = done.get(label)
        # (a run that failed is run again: ASGD's divergence used to end in an error, now in a stop_reason)
        rows.append(cached if cached and cached["overrides"] == o and "error" not in cached else run(label, o))
        save("noniid", rows)  # as far as it got
    curves("noniid", rows, "non-IID (2 shards a party), h_c = 150 (each run to its own budget)")
    return rows


CENTRALIZED = ["fl.clients=1", "fl.min_clients=1", "compute.nodes={}", "fl.algorithm=fedavg", "fl.epochs=1",
               "fl.rounds=8"]


def centralized() -> list[dict]:
    """Centralized SGD, the accuracy reference: one party holding the whole training set, at the
    fast parties' speed, one epoch a round (FedAvg with one worker: w + delta is plain SGD), 8
    epochs (ESync's 20 rounds at h_c = 150 trained on ~7.9 epochs' worth of samples)."""
    rows = [run("centralized-sgd", CENTRALIZED)]
    save("centralized", rows)
    return rows


BASELINE_RUNS = {
    "esync": ["fl.rounds=20"],
    "ssgd": [*SSGD, "fl.rounds=1000", "fl.eval_every=10"],
    "asgd": [*ASGD, "fl.rounds=6000", "fl.eval_every=200"],
    "dcasgd": [*DCASGD, "fl.rounds=6000", "fl.eval_every=200"],
    "fedavg": ["fl.algorithm=fedavg", "fl.rounds=5"],
    "fedasync+poly": ["fl.algorithm=fedasync", "fl.fedasync.staleness=poly", "fl.rounds=60", "fl.eval_every=4"],
    "fedasync+hinge": ["fl.algorithm=fedasync", "fl.fedasync.staleness=hinge", "fl.rounds=60", "fl.eval_every=4"],
    "feddrop(6)": ["fl.algorithm=feddrop", "fl.feddrop.k_hat=6", "fl.rounds=10"],
    "tifl": ["fl.algorithm=tifl", "fl.tifl.tier_probs=[0.5,0.5]", "fl.tifl.credits=[100,3]", "fl.sample=4",
             "fl.min_clients=4", "fl.rounds=10"],  # a tier asked is 4 of the 12
}


def baselines() -> list[dict]:
    # ESync and SSGD at h_c = 150 are the headline's runs (the same scenarios): reused when there.
    done = {r["label"].split("-hc")[0]: r for r in _load("headline") if r["label"].endswith("-hc150")}
    rows = []
    for label, o in BASELINE_RUNS.items():
        rows.append(dict(done[label], label=label) if label in done else run(label, o))
        save("baselines", rows)  # as far as it got
    curves("baselines", rows, "every algorithm, h_c = 150 (each run to its own budget)")
    return rows


FEDDROP_KS = (4, 6, 8, 10)


def feddrop_run(k: int) -> list[str]:
    return ["fl.algorithm=feddrop", f"fl.feddrop.k_hat={k}", "fl.rounds=8"]


def feddrop() -> list[dict]:
    import sys as _sys

    ks = [int(k) for k in _sys.argv[2:]] or list(FEDDROP_KS)
    done = {r["label"]: r for r in _load("feddrop")}
    rows = [done.get(f"feddrop-k{k}") or run(f"feddrop-k{k}", feddrop_run(k)) for k in ks]
    rows = sorted({**done, **{r["label"]: r for r in rows}}.values(), key=lambda r: int(r["label"].split("-k")[1]))
    save("feddrop", rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot([int(r["label"].split("-k")[1]) for r in rows], [r["final_loss"] for r in rows], "o-")
    ax.set_xlabel("K_hat (clients not waited for)")
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
        "esync-cnn4-hc150": ["model=cnn4", "fl.rounds=10"],
        "ssgd-cnn4-hc150": ["model=cnn4", *SSGD, "fl.rounds=600", "fl.eval_every=10"],
    },
    "fedasync": {
        "fedavg-cnn4-hc20": ["model=cnn4", *speeds(20), "fl.algorithm=fedavg", iterations(20),
                             "fl.rounds=15"],
        "fedasync-cnn4-hc20": ["model=cnn4", *speeds(20), "fl.algorithm=fedasync", "fl.fedasync.staleness=poly",
                               iterations(20), "fl.rounds=100000", "fl.max_time_s=48",
                               "fl.eval_every=60"],
    },
    "noniid": {
        "fedavg-cnn4-hc20-noniid": ["model=cnn4", *speeds(20), "data.partition=shards", "fl.algorithm=fedavg",
                                    iterations(20), "fl.rounds=15"],
        "fedasync-cnn4-hc20-noniid": ["model=cnn4", *speeds(20), "data.partition=shards", "fl.algorithm=fedasync",
                                      "fl.fedasync.staleness=poly", iterations(20), "fl.rounds=100000",
                                      "fl.max_time_s=48", "fl.eval_every=60"],
    },
}
# "hc": ESync against SSGD across h_c (h_c = 150 is the headline's pair, reused).  Budgets past 0.8:
# ESync's rounds shrink as h_c grows (a round holds ~0.8 h_c fast iterations); at h_c = 1 ESync runs
# as SSGD does, one iteration a party a round.  SSGD's model does not depend on h_c (it passes 0.8
# near its round 220 at h_c = 150), only its time does, so 400 rounds each.
CNN4_HC_ESYNC_ROUNDS = {1: 400, 10: 100, 50: 25, 300: 8}
CNN4_RUNS["hc"] = {}
for _h, _rounds in CNN4_HC_ESYNC_ROUNDS.items():
    CNN4_RUNS["hc"][f"esync-cnn4-hc{_h}"] = ["model=cnn4", *speeds(_h), f"fl.rounds={_rounds}",
                                              *(["fl.eval_every=10"] if _h == 1 else [])]
    CNN4_RUNS["hc"][f"ssgd-cnn4-hc{_h}"] = ["model=cnn4", *speeds(_h), *SSGD, "fl.rounds=400",
                                             "fl.eval_every=10"]


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


def every_run() -> dict[str, list[str]]:
    """Each experiment's runs by label: their overrides on scenarios/esync.yaml (tests parse them all)."""
    runs = {**HEADLINE_RUNS, "centralized-sgd": CENTRALIZED}
    runs.update({f"{a}-hc{h}": hc_run(a, h) for h in HC_ESYNC_ROUNDS for a in ("esync", "ssgd")})
    runs.update({f"{label}-noniid": NONIID_DATA + o for label, o in NONIID_RUNS.items()})
    runs.update({f"baseline-{label}": o for label, o in BASELINE_RUNS.items()})
    runs.update({f"feddrop-k{k}": feddrop_run(k) for k in FEDDROP_KS})
    for part in CNN4_RUNS.values():
        runs.update(part)
    return runs


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
