"""``emu soak`` / ``real soak``: a long FL run under random faults, then an audit of what it lost.

    emu soak  [--rounds 1000] [--seed 1] [--clients 4] [--out runs/soak-emu-<date>] [--key-file F]
    real soak [--rounds 60]   [--seed 1] [--clients 3] [--out runs/soak-real-<date>] [--key-file F]

The faults are drawn from ``--seed`` into an ordinary scenario file
(``soak.yaml`` in the run folder, so a run can be repeated or inspected):
client crashes at random protocol points with restarts, a few controller
crashes (restarted from their checkpoint), SIGKILL-style offline windows,
partitions, message loss, duplicates, reordering, per-round dropouts and
corrupt updates (NaN, Inf, scaled, garbage, stale).  The model is the small
CNN.  ``emu`` runs it in virtual time; ``real`` with ``real launch`` (one
process per rank on loopback), where the offline windows are real SIGKILLs.
At the end, report.audit counts faults and updates and checks that no
completed round was lost or counted twice; the table goes to ``soak.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from dtemu.core.scenario import CLIENT_CRASH_POINTS, CONTROLLER_CRASH_POINTS, parse_scenario



@dataclass(frozen=True)
class SoakRuntime:
    """How a soak is drawn and run in one runtime (what differs between ``emu soak`` and ``real soak``)."""

    rounds: int  # the defaults of --rounds and --clients
    clients: int
    round_s: float  # about how long a round takes: the horizon the faults are drawn over
    controller_crash_p: float  # per round
    rounds_per_offline: int  # one offline window per this many rounds
    round_timeout_s: float
    compute: dict = field(default_factory=dict)
    cli: tuple[str, ...] = ()  # the command that runs the drawn scenario
    timeout_per_round_s: float | None = None  # real launch: kill everything after this per round (+300 s)

    def command(self, path: Path, run: Path, rounds: int) -> list[str]:
        cmd = [sys.executable, "-m", *self.cli, str(path), "--out", str(run), "--no-tui"]
        if self.timeout_per_round_s is not None:
            cmd += ["--timeout", str(int(rounds * self.timeout_per_round_s + 300))]
        return cmd


RUNTIMES = {
    # emu: a round is ~0.6 s of modelled training (10 ms a sample, 64 samples) and closes at 2 s at the latest
    "emu": SoakRuntime(rounds=1000, clients=4, round_s=0.8, controller_crash_p=0.01, rounds_per_offline=40,
                       round_timeout_s=2.0, compute={"default": {"train_s_per_sample": 0.01, "jitter": 0.2}},
                       cli=("dtemu.emu.cli", "run")),
    # real: whatever this machine takes (~0.1 s), closing at 3 s; offline windows are real SIGKILLs
    "real": SoakRuntime(rounds=60, clients=3, round_s=1.0, controller_crash_p=0.03, rounds_per_offline=8,
                        round_timeout_s=3.0, cli=("dtemu.real.cli", "launch"), timeout_per_round_s=20),
}

CORRUPTIONS = ("nan", "inf", "scale", "garbage", "stale")


def soak_scenario(mode: str, rounds: int, seed: int, clients: int = 4) -> dict:
    """The soak's scenario for runtime ``mode`` ("emu" or "real"), its faults drawn from ``seed``."""
    rt = RUNTIMES[mode]
    rng = np.random.default_rng(seed)
    names = [f"client{i}" for i in range(1, clients + 1)]
    horizon = rounds * rt.round_s
    crashes = []
    for r in range(1, rounds + 1):
        if rng.random() < 0.06:
            crashes.append({"node": str(rng.choice(names)), "round": r, "at": str(rng.choice(CLIENT_CRASH_POINTS)),
                            "restart_after_s": round(float(rng.uniform(0.1, 3.0)), 3)})
        if rng.random() < rt.controller_crash_p:
            crashes.append({"node": "controller", "round": r, "at": str(rng.choice(CONTROLLER_CRASH_POINTS)),
                            "restart_after_s": round(float(rng.uniform(0.2, 1.0)), 3)})
    offline = []
    for _ in range(max(1, rounds // rt.rounds_per_offline)):
        start = float(rng.uniform(5.0, horizon))
        offline.append({"node": str(rng.choice(names)), "start_s": round(start, 3),
                        "end_s": round(start + float(rng.uniform(0.5, 6.0)), 3)})
    partitions = []
    for _ in range(max(1, rounds // 50)):
        start = float(rng.uniform(5.0, horizon))
        cut = sorted(rng.choice(names, size=int(rng.integers(1, clients)), replace=False).tolist())
        partitions.append({"nodes": cut, "start_s": round(start, 3), "end_s": round(start + float(rng.uniform(1, 5)), 3)})
    corrupt = []
    for name in names:
        bad_rounds = sorted({int(r) for r in rng.integers(1, rounds + 1, size=max(1, rounds // 60))})
        corrupt.append({"node": name, "kind": str(rng.choice(CORRUPTIONS)), "rounds": bad_rounds})
    return {
        "name": f"soak_{mode}",
        "seed": seed,
        "model": "small_cnn",
        "threads": 1,
        "data": {"partition": "dirichlet", "alpha": 0.5, "test_samples": 1000},
        "fl": {"clients": clients, "rounds": rounds, "subset": 64, "batch_size": 32, "lr": 0.05,
               "codec": "q8", "min_clients": 2, "round_timeout_s": rt.round_timeout_s,
               "barrier_timeout_s": 120, "on_failed_round": "retry", "max_retries": 1,
               "max_update_norm": 50.0, "eval_every": max(1, rounds // 10)},
        "compute": rt.compute,
        "network": {"default": {"up_mbps": 100, "down_mbps": 100, "latency_ms": 5}},
        "faults": {"crashes": crashes, "offline": offline, "partitions": partitions, "message_loss": 0.02,
                   "duplicate_p": 0.02, "reorder_s": 0.05, "dropout_p": 0.03, "corrupt": corrupt},
    }


def add_parser(sub, mode: str) -> None:
    """The ``soak`` subcommand of ``emu`` (mode "emu") or ``real`` (mode "real")."""
    rt = RUNTIMES[mode]
    p = sub.add_parser("soak", help="a long FL run under random faults, then an audit of what it lost",
                       description=__doc__.split("\n\n")[2].replace("\n", " "))
    p.add_argument("--rounds", type=int, default=rt.rounds, help=f"rounds (default: {rt.rounds})")
    p.add_argument("--seed", type=int, default=1, help="draws the faults (default: 1)")
    p.add_argument("--clients", type=int, default=rt.clients, help=f"clients (default: {rt.clients})")
    p.add_argument("--out", help=f"folder for soak.yaml, the run and soak.json (default: runs/soak-{mode}-<date>-<time>)")
    p.add_argument("--key-file", help="seal every message with this key")


def main(args, mode: str) -> int:
    """Draw the faults, run the soak scenario in ``mode``, audit it; exit 1 if it failed or lost data."""
    from .audit import audit

    rounds, clients = args.rounds, args.clients
    out = Path(args.out or f"runs/soak-{mode}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    raw = soak_scenario(mode, rounds, args.seed, clients)
    parse_scenario(raw)  # refuse a bad draw before anything starts
    path = out / "soak.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    run = out / "run"
    started = time.monotonic()
    cmd = RUNTIMES[mode].command(path, run, rounds)
    if args.key_file:
        cmd += ["--key-file", args.key_file]
    done = subprocess.run(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    result = audit(run)
    result.update(command=" ".join([mode, "soak", "--rounds", str(rounds), "--seed", str(args.seed),
                                    "--clients", str(clients), "--out", str(out)]),
                  exit_code=done.returncode, wall_s=round(time.monotonic() - started, 1),
                  planned={"client_crashes": sum(c["node"] != "controller" for c in raw["faults"]["crashes"]),
                           "controller_crashes": sum(c["node"] == "controller" for c in raw["faults"]["crashes"]),
                           "offline_windows": len(raw["faults"]["offline"]),
                           "partitions": len(raw["faults"]["partitions"])})
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if done.returncode == 0 and result["lost_data"] == 0 else 1
