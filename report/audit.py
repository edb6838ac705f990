"""Audit an FL run folder (emu or real): what faults it met and whether anything was lost.

    python -m tools.audit RUN_FOLDER [--json]

Counts, from events.jsonl: faults injected by class, rounds completed and
failed, updates accepted / rejected (by reason) / late / duplicate, transport
frames refused.  Then checks that nothing was lost or counted twice:

- every round up to the last is closed and checkpointed exactly once, in order
  (a controller restarted from its checkpoint redoes only unsaved rounds);
- every update aggregated into a saved round was accepted in that round, and
  the clients a saved round names are the ones accepted in its last attempt;
- the summary's tallies are the events' (nothing counted but not logged);
- the final model is the one the last aggregation or resume produced.

``lost_data`` is the number of violations; it must be 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from dtemu.host.rundir import read_events_partial, read_summary


def audit(folder: str | Path) -> dict:
    folder = Path(folder)
    events, torn = read_events_partial(folder)
    summary = read_summary(folder)
    faults: Counter = Counter()
    for e in events:
        if e["kind"] == "fault":
            faults[e["fault"] if e["fault"] != "crash" else f"crash_{e['at']}"] += 1
        elif e["kind"] == "dropout":
            faults["dropout"] += 1
        elif e["kind"] == "node_down" and e["node"] != "controller":
            faults["node_down"] += 1
    ctrl = [e for e in events if e["node"] == "controller"]
    problems: list[str] = []

    # Walk the controller's life (lives): per round attempt, what was accepted and closed.
    accepted = defaultdict(set)  # (life, round) -> clients accepted
    closes, saved = [], []
    life, last_sha = 0, None
    for e in ctrl:
        k = e["kind"]
        if k == "run_start":
            life += 1
        elif k == "round_start":
            accepted[(life, e["round"])] = set()
        elif k == "update_accepted":
            accepted[(life, e["round"])].add(e["client"])
        elif k == "round_close":
            closes.append((life, e["round"], sorted(e["clients"])))
            if sorted(e["clients"]) != sorted(accepted[(life, e["round"])]):
                problems.append(f"round {e['round']} closed with {e['clients']} but accepted "
                                f"{sorted(accepted[(life, e['round'])])}")
        elif k == "checkpoint":
            saved.append(e["round"])
        elif k in ("aggregated", "resume"):
            last_sha = e["model_sha256"]
    last = max(saved) if saved else 0
    if saved != list(range(1, last + 1)):
        problems.append(f"checkpointed rounds are not 1..{last} once each: {saved}")
    planned = _planned_rounds(folder)
    if summary.get("stop_reason") == "done" and planned is not None and last != planned:
        problems.append(f"{last} rounds saved of the {planned} the scenario runs")
    # The summary's tallies are those of the rounds that were saved: a controller that
    # died after its last checkpoint resumes from the tallies in it, and redoes the rest.
    saved_in = set()
    life = 0
    for e in ctrl:
        if e["kind"] == "run_start":
            life += 1
        elif e["kind"] == "checkpoint":
            saved_in.add((life, e["round"]))
    counts, redone = Counter(), Counter()
    life, current = 0, None
    for e in ctrl:
        k = e["kind"]
        if k == "run_start":
            life, current = life + 1, None
        elif k == "round_start":
            current = e["round"]
        if k not in ("update_accepted", "update_late", "update_rejected"):
            continue
        reason = {"update_accepted": "accepted", "update_late": "late"}.get(k) or \
            {"invalid": "rejected"}.get(e.get("reason", "invalid"), e.get("reason", "").replace(" ", "_"))
        (counts if (life, current) in saved_in else redone)[reason] += 1
    if summary.get("updates") is not None and dict(counts) != summary["updates"]:
        problems.append(f"summary counts {summary['updates']} but the events say {dict(counts)}")
    if last_sha is not None and summary.get("model_sha256") != last_sha:
        problems.append("the final model is not the last aggregated one")
    frames = Counter(e.get("reason") for e in events if e["kind"] == "frame_rejected")
    return {
        "run": str(folder),
        "runtime": summary.get("runtime"),
        "rounds": summary.get("rounds"),
        "rounds_failed": summary.get("rounds_failed"),
        "faults": dict(sorted(faults.items())),
        "updates": dict(sorted(counts.items())),
        "redone": dict(sorted(redone.items())),  # tallied in rounds a crash undid (done again)
        "frames_rejected": dict(sorted(frames.items())),
        "controller_lives": life,
        "torn_event_lines": torn,
        "lost_data": len(problems),
        "problems": problems[:20],
        "final_accuracy": summary.get("final_accuracy"),
    }


def _planned_rounds(folder: Path) -> int | None:
    for path in (folder / "scenario.json", folder / "rank0" / "scenario.json"):
        if path.exists():
            return json.loads(path.read_text())["fl"]["rounds"]
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.audit", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run folder")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    result = audit(args.run)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:18} {v}")
    return 0 if result["lost_data"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
