"""A sealed FL run with and without a hostile participant on its domain, side by side.

    python -m tools.bench_attack [--flood 1000] [--rounds 3] [--out runs/attack]

Runs ``real launch`` of a small sealed scenario (loopback only) twice: clean,
then with ``tools.rogue`` on the same DDS domain forging, replaying and
flooding at ``--flood`` samples a second for the whole run.  Prints, for both:
rounds, updates accepted, the final model, the size of the event log, and what
the ranks' transports refused.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

SCENARIO = {
    "name": "attack", "seed": 3, "model": "small_cnn", "threads": 1,
    "data": {"partition": "iid", "test_samples": 500},
    "fl": {"clients": 2, "rounds": 3, "subset": 256, "batch_size": 32, "lr": 0.05, "codec": "q8",
           "min_clients": 2, "round_timeout_s": 40, "barrier_timeout_s": 30},
}


def launch(scenario: Path, out: Path, domain: int, key_file: Path, flood: float | None) -> dict:
    env = {**os.environ, "DTEMU_KEY_FILE": str(key_file)}
    cmd = [sys.executable, "-m", "dtemu.real.cli", "launch", str(scenario), "--out", str(out), "--no-tui",
           "--domain", str(domain), "--timeout", "300", "--time-scale", "1"]
    rogue = None
    if flood is not None:
        rogue = subprocess.Popen([sys.executable, "-m", "dtemu.real.cli", "rogue", "--domain", str(domain), "--duration", "300",
                                  "--flood", str(flood), "--report", str(out.parent / f"{out.name}-rogue.json")],
                                 env={**os.environ, "DTEMU_KEY": "", "DTEMU_KEY_FILE": ""},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    code = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).returncode
    wall = time.monotonic() - t0
    published = {}
    if rogue is not None:
        try:
            rogue.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rogue.kill()
        published = json.loads((out.parent / f"{out.name}-rogue.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    refused: dict[str, int] = {}
    for rank in range(3):
        path = out / f"rank{rank}" / "summary.json"
        transport = json.loads(path.read_text()).get("real", {}).get("transport", {}) if path.exists() else {}
        for k in ("forged_frames", "replayed_frames", "malformed", "orphan_frames", "invalid_hello"):
            refused[k] = refused.get(k, 0) + transport.get(k, 0)
    lines = sum(1 for _ in open(out / "events.jsonl"))
    return {"exit": code, "rounds": summary["rounds"], "updates": summary["updates"],
            "model_sha256": summary["model_sha256"][:16], "event_lines": lines,
            "event_bytes": (out / "events.jsonl").stat().st_size, "wall_s": round(wall, 1),
            "refused": refused, "published": {k: v for k, v in published.items() if v}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench_attack", description=__doc__.split("\n\n")[0])
    p.add_argument("--flood", type=float, default=1000.0, help="rogue samples a second (default 1000)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="runs/attack")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scenario = out / "attack.json"
    scenario.write_text(json.dumps({**SCENARIO, "fl": {**SCENARIO["fl"], "rounds": args.rounds}}))
    key = out / "key"
    key.write_text(secrets.token_hex(32))
    domain = 1 + os.getpid() % 200
    clean = launch(scenario, out / "clean", domain, key, None)
    attacked = launch(scenario, out / "attacked", domain + 1, key, args.flood)
    for name, r in (("clean", clean), ("attacked", attacked)):
        print(f"{name:9} {json.dumps(r)}")
    same = clean["model_sha256"] == attacked["model_sha256"]
    print(f"same model: {same}; event log {attacked['event_lines'] / clean['event_lines']:.2f}x the clean one")
    return 0 if same and attacked["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
