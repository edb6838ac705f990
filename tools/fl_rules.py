"""FL's update rules side by side on one workload: accuracy, rounds and bytes.

    python -m tools.fl_rules [scenarios/fl_codecs.yaml] [--codec fp32] [--rules a,b,...]
                             [--async-updates N] [--set KEY=VALUE ...]

Runs ``emu run SCENARIO --no-tui`` once per rule (default: fedavg, fedprox, fedadam, fedyogi,
fedadagrad; ``--rules`` names others of RULES below, each with its parameters there, the
scenario's other keys unchanged) and prints a markdown table: final accuracy, the first round
that reached 0.95 and 0.98, rounds, bytes up and down, virtual time and model_sha256.  An
asynchronous rule (fedasync, asgd, dcasgd) makes ``fl.rounds`` updates of one client each:
``--async-updates N`` sets its fl.rounds (e.g. rounds × clients, for as many client updates as
the synchronous rules' rounds take), and its "rounds to" counts updates.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RULES = {
    "fedavg": [],
    "fedprox": ["fl.proximal_mu=0.01"],
    "fedadam": [],      # fl.server_opt's defaults: eta 0.01, beta1 0.9, beta2 0.99, tau 0.001
    "fedyogi": [],
    "fedadagrad": [],
    "feddrop": ["fl.feddrop.k_hat=1"],
    "tifl": [],         # fl.tifl's defaults: 2 tiers, alike, no credit limit
    "fedasync": ["fl.fedasync.staleness=poly"],
    "asgd": [],
    "dcasgd": [],       # fl.dcasgd_lambda 0.04
    "esync": [],        # fl.esync: no cap, questions time out after 5 s
}
DEFAULT_RULES = "fedavg,fedprox,fedadam,fedyogi,fedadagrad"
ASYNCHRONOUS = ("fedasync", "asgd", "dcasgd")


def run(scenario: str, rule: str, sets: list[str]) -> tuple[dict, list[dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "dtemu.emu.cli", "run", scenario, "--no-tui", "--out", f"{tmp}/run",
               "--set", f"fl.algorithm={rule}"]
        for s in RULES[rule] + sets:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        summary = json.loads(Path(f"{tmp}/run/summary.json").read_text())
        evals = [json.loads(line) for line in Path(f"{tmp}/run/events.jsonl").read_text().splitlines()
                 if '"kind":"eval"' in line]
    return summary, evals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", nargs="?", default="scenarios/fl_codecs.yaml")
    p.add_argument("--codec", default="fp32")
    p.add_argument("--rules", default=DEFAULT_RULES, help="comma-separated, of: " + ", ".join(RULES))
    p.add_argument("--async-updates", type=int, default=None, metavar="N",
                   help="fl.rounds of an asynchronous rule (updates of one client each)")
    p.add_argument("--set", dest="sets", action="append", default=[])
    args = p.parse_args(argv)
    rules = args.rules.split(",")
    if unknown := [r for r in rules if r not in RULES]:
        p.error(f"unknown rule(s) {', '.join(unknown)}; known: {', '.join(RULES)}")
    sets = [f"fl.codec={args.codec}", *args.sets]
    print(f"{args.scenario}, fl.codec={args.codec} {' '.join(args.sets)}\n")
    print("| rule | parameters | accuracy | rounds to 0.95 / 0.98 | rounds | up MB | down MB | time s | model |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rule in rules:
        extra = [f"fl.rounds={args.async_updates}"] if rule in ASYNCHRONOUS and args.async_updates else []
        s, evals = run(args.scenario, rule, sets + extra)

        def first(target):
            return next((e["round"] for e in evals if e["accuracy"] >= target), "-")

        print(f"| {rule} | {' '.join(RULES[rule] + extra) or 'defaults'} | {s['final_accuracy']:.4f} | "
              f"{first(0.95)} / {first(0.98)} | {s['rounds']} | {s['bytes_up'] / 1e6:.2f} | "
              f"{s['bytes_down'] / 1e6:.2f} | {s['time_s']:.1f} | {s['model_sha256'][:12]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
