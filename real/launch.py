"""``real launch``: every rank of a scenario as its own process on this machine.

Ranks talk over the loopback profile on a domain of their own; the launcher
follows their ``events.jsonl`` files to drive one dashboard, stops stragglers
once the run is over (FL: when the controller exits), and gathers the ranks'
folders into one run folder that reads like emu's: ``events.jsonl`` (every
rank's events, by time), ``summary.json`` and ``rank<N>/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from core.rundir import read_events, write_json
from core.scenario import Scenario

GRACE_S = 15.0  # how long clients may take to exit after the controller did


class _Follower:
    """Reads the new complete lines of a growing events.jsonl."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out


def _domain_id() -> int:
    # A domain of our own, so that two launches on one machine do not meet.
    return 1 + os.getpid() % 200


def launch(args, scenario: Scenario) -> int:
    from tools.dashboard import Dashboard

    out = Path(args.out) if args.out else Path("runs") / f"{scenario.name}-real-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    ranks = len(scenario.node_names)
    domain = args.domain if args.domain is not None else _domain_id()
    threads = args.threads or max(1, (os.cpu_count() or 1) // ranks)
    procs = []
    env = {**os.environ, "DTEMU_EPOCH": repr(time.time())}  # the ranks' events share one time origin
    for rank in range(ranks):
        cmd = [sys.executable, "-m", "real.cli", "run", args.scenario, "--rank", str(rank),
               "--out", str(out / f"rank{rank}"), "--no-tui", "--domain", str(domain),
               "--threads", str(threads), "--profile", args.profile]
        for o in args.overrides:
            cmd += ["--set", o]
        log = open(out / f"rank{rank}.log", "wb")
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
    followers = [_Follower(out / f"rank{r}" / "events.jsonl") for r in range(ranks)]
    dashboard = Dashboard(scenario, title=f"real launch · {scenario.name}",
                          enabled=not args.no_tui and sys.stdout.isatty())
    started = time.monotonic()
    codes: dict[int, int] = {}
    try:
        with dashboard:
            leader_done_at = None
            while len(codes) < ranks:
                for f in followers:
                    for event in f.poll():
                        dashboard.observe(event)
                for rank, p in enumerate(procs):
                    if rank not in codes and p.poll() is not None:
                        codes[rank] = p.returncode
                now = time.monotonic()
                if scenario.mode == "fl" and 0 in codes and leader_done_at is None:
                    leader_done_at = now
                if leader_done_at is not None and now - leader_done_at > GRACE_S:
                    _stop(procs, codes)
                if args.timeout is not None and now - started > args.timeout:
                    print(f"real launch: timed out after {args.timeout:g}s", file=sys.stderr)
                    _stop(procs, codes)
                    break
                time.sleep(0.1)
    except KeyboardInterrupt:
        _stop(procs, codes, sig=signal.SIGINT)
        print(f"real launch: interrupted; partial runs in {out}", file=sys.stderr)
        return 130
    for p in procs:
        p.wait()
    codes = {r: p.returncode for r, p in enumerate(procs)}
    summary = gather(out, scenario, time.monotonic() - started)
    bad = {r: c for r, c in codes.items() if c != 0}
    summary["exit_codes"] = codes
    write_json(out, "summary.json", summary)
    if bad:
        print(f"real launch: ranks exited with {bad}; logs in {out}/rank<N>.log", file=sys.stderr)
        return max(bad.values()) if max(bad.values()) > 0 else 1
    acc = summary.get("final_accuracy")
    print(f"{scenario.name} (real, {ranks} processes): accuracy {acc}, up {summary.get('bytes_up', 0) / 1e6:.2f} MB, "
          f"down {summary.get('bytes_down', 0) / 1e6:.2f} MB, wall {summary['wall_time_s']:.1f} s -> {out}")
    return 0


def _stop(procs, codes, sig=signal.SIGTERM) -> None:
    for rank, p in enumerate(procs):
        if p.poll() is None:
            p.send_signal(sig)
    deadline = time.monotonic() + 10
    for rank, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        codes[rank] = p.returncode


def gather(out: Path, scenario: Scenario, wall: float) -> dict:
    """Merge the ranks' folders: every event by time, one summary like emu's."""
    ranks = len(scenario.node_names)
    events, summaries = [], []
    for rank in range(ranks):
        folder = out / f"rank{rank}"
        if (folder / "events.jsonl").exists():
            events += [(e.get("t", 0), rank, i, e) for i, e in enumerate(read_events(folder))]
        try:
            summaries.append(json.loads((folder / "summary.json").read_text()))
        except (OSError, ValueError):
            summaries.append({})
    events.sort(key=lambda x: x[:3])
    with open(out / "events.jsonl", "w") as f:
        for *_, e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
    training = [s for s, name in zip(summaries, scenario.node_names) if name in scenario.training_nodes]
    traffic = {"bytes_up": sum(s.get("bytes_sent", 0) for s in training),
               "bytes_down": sum(s.get("bytes_received", 0) for s in training)}
    if scenario.mode == "ddp":
        hashes = sorted({s.get("model_sha256") for s in summaries if s.get("model_sha256")})
        steps = summaries[0].get("steps", 0) if summaries else 0
        return {"scenario": scenario.name, "runtime": "real", "mode": "ddp",
                "compression": scenario.ddp.compression, "workers": ranks, "seed": scenario.seed,
                "final_accuracy": summaries[0].get("final_accuracy"), "steps": steps, **traffic,
                # As emu: what the steps' exchanges sent (no barrier, no evaluation), per step and rank.
                "bytes_per_step": round(sum(s.get("step_bytes_sent", 0) for s in summaries)
                                        / max(steps, 1) / ranks, 3),
                "model_sha256": hashes[0] if hashes else None, "models_agree": len(hashes) == 1,
                "wall_time_s": round(wall, 3)}
    lead = dict(summaries[0])
    for own in ("node", "bytes_sent", "bytes_received"):  # the controller's own view; replaced below
        lead.pop(own, None)
    lead.update(traffic)
    lead["wall_time_s"] = round(wall, 3)
    return lead
