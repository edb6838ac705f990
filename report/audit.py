"""Audit an FL run folder (emu or real): what faults it met and whether anything was lost.
(ps, geo and ddp runs are audited by ``report.audit_ps``, ``report.audit_geo`` and
``report.audit_ddp``; a mode without checks is refused in one line.)

    emu audit RUN [--json]

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

from dtemu.core import events as ev
from dtemu.host.rundir import read_events_partial, read_summary
from dtemu.report.audit_ddp import check_ddp
from dtemu.report.audit_geo import check_geo
from dtemu.report.audit_ps import check_ps

# The other modes' checks: (events, summary, finished) -> (their fields, the problems found).
CHECKS = {"ps": check_ps, "geo": check_geo, "ddp": check_ddp}
AUDITED = ("fl", *CHECKS)


class NotAudited(Exception):
    """A run folder of a mode the audit has no checks for."""


def _mode(folder: Path, summary: dict) -> str:
    if summary.get("mode"):
        return summary["mode"]
    for path in (folder / "scenario.json", folder / "rank0" / "scenario.json"):
        if path.exists():
            return json.loads(path.read_text()).get("mode") or "fl"
    return "fl"


def audit(folder: str | Path) -> dict:
    folder = Path(folder)
    events, torn = read_events_partial(folder)
    if not events and not (folder / "summary.json").exists():
        raise FileNotFoundError(f"{folder} has no events.jsonl and no summary.json: not a run folder")
    # A run that was killed or is still going has no summary yet: audit what its events say.
    finished = (folder / "summary.json").exists()
    summary = read_summary(folder) if finished else {}
    faults: Counter = Counter()
    for e in events:
        if e["kind"] == ev.FAULT:
            faults[e["fault"] if e["fault"] != "crash" else f"crash_{e['at']}"] += 1
        elif e["kind"] == ev.DROPOUT:
            faults["dropout"] += 1
        elif e["kind"] == ev.NODE_DOWN and e["node"] != "controller":
            faults["node_down"] += 1
    mode = _mode(folder, summary)
    if mode in CHECKS:
        fields, problems = CHECKS[mode](events, summary, finished)
        return {"run": str(folder), "mode": mode, "finished": finished, "runtime": summary.get("runtime"),
                **fields, "faults": dict(sorted(faults.items())), "frames_rejected": _frames(events),
                "torn_event_lines": torn, "lost_data": len(problems), "problems": problems[:20],
                "final_accuracy": summary.get("final_accuracy")}
    if mode not in AUDITED:
        raise NotAudited(f"{folder} is a {mode} run: emu audit checks {', '.join(AUDITED)} runs")
    ctrl = [e for e in events if e["node"] == "controller"]
    problems: list[str] = []

    # Walk the controller's life (lives): per round attempt, what was accepted and closed.
    accepted = defaultdict(set)  # (life, round) -> clients accepted
    closes, saved = [], []
    life, last_sha = 0, None
    for e in ctrl:
        k = e["kind"]
        if k == ev.RUN_START:
            life += 1
        elif k == ev.ROUND_START:
            accepted[(life, e["round"])] = set()
        elif k == ev.UPDATE_ACCEPTED:
            accepted[(life, e["round"])].add(e["client"])
        elif k == ev.ROUND_CLOSE:
            closes.append((life, e["round"], sorted(e["clients"])))
            if sorted(e["clients"]) != sorted(accepted[(life, e["round"])]):
                problems.append(f"round {e['round']} closed with {e['clients']} but accepted "
                                f"{sorted(accepted[(life, e['round'])])}")
        elif k == ev.CHECKPOINT:
            saved.append(e["round"])
        elif k in (ev.AGGREGATED, ev.RESUME):
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
        if e["kind"] == ev.RUN_START:
            life += 1
        elif e["kind"] == ev.CHECKPOINT:
            saved_in.add((life, e["round"]))
    counts, redone = Counter(), Counter()
    life, current = 0, None
    for e in ctrl:
        k = e["kind"]
        if k == ev.RUN_START:
            life, current = life + 1, None
        elif k == ev.ROUND_START:
            current = e["round"]
        if k not in (ev.UPDATE_ACCEPTED, ev.UPDATE_LATE, ev.UPDATE_REJECTED):
            continue
        reason = {ev.UPDATE_ACCEPTED: "accepted", ev.UPDATE_LATE: "late"}.get(k) or \
            {"invalid": "rejected"}.get(e.get("reason", "invalid"), e.get("reason", "").replace(" ", "_"))
        (counts if (life, current) in saved_in else redone)[reason] += 1
    # Refusals beyond a rate limit are only counted (events_suppressed): then the events cannot
    # account for every tally.
    suppressed = sum(e["suppressed"] for e in ctrl if e["kind"] == ev.EVENTS_SUPPRESSED
                     and e.get("of") in (ev.UPDATE_REJECTED, ev.UPDATE_LATE))
    if summary.get("updates") is not None and not suppressed and dict(counts) != summary["updates"]:
        problems.append(f"summary counts {summary['updates']} but the events say {dict(counts)}")
    if finished and last_sha is not None and summary.get("model_sha256") != last_sha:
        problems.append("the final model is not the last aggregated one")
    return {
        "run": str(folder),
        "mode": "fl",
        "finished": finished,  # False: killed or still going (no summary.json); checked as far as it got
        "runtime": summary.get("runtime"),
        "rounds": summary.get("rounds"),
        "rounds_failed": summary.get("rounds_failed"),
        "faults": dict(sorted(faults.items())),
        "updates": dict(sorted(counts.items())),
        "redone": dict(sorted(redone.items())),  # tallied in rounds a crash undid (done again)
        "frames_rejected": _frames(events),
        "controller_lives": life,
        "torn_event_lines": torn,
        "refusals_only_counted": suppressed,
        "lost_data": len(problems),
        "problems": problems[:20],
        "final_accuracy": summary.get("final_accuracy"),
    }


def _frames(events: list[dict]) -> dict:
    """Transport frames refused, by reason (the collectives' carry only their error)."""
    frames = Counter(e.get("reason") or e.get("error", "")[:40] for e in events if e["kind"] == ev.FRAME_REJECTED)
    return dict(sorted(frames.items()))


def _planned_rounds(folder: Path) -> int | None:
    for path in (folder / "scenario.json", folder / "rank0" / "scenario.json"):
        if path.exists():
            return json.loads(path.read_text())["fl"]["rounds"]
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="emu audit", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="run folder")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    try:
        result = audit(args.run)
    except (FileNotFoundError, NotAudited) as err:
        print(f"audit: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k:18} {v}")
    return 0 if result["lost_data"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
