"""Audit a run folder (emu or real, any mode): what faults it met and whether anything was lost.

    emu audit RUN [--json]

Counts, from events.jsonl, the faults injected by class and the transport frames refused; then
the run's mode (core.modes names its checks: report.audit_fl, audit_geo, audit_ddp)
checks that nothing was lost or counted twice.  ``lost_data`` is the number of violations; it
must be 0.  A mode without checks is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from dtemu.core import events as ev
from dtemu.host.rundir import read_events_partial, read_summary
from dtemu.core.modes import MODES
from dtemu.host.resolve import resolve

# A mode's checks: (events, summary, finished, scenario) -> (their fields, the problems found).
AUDITED = tuple(name for name, mode in MODES.items() if mode.audit)


class NotAudited(Exception):
    """A run folder of a mode the audit has no checks for."""


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
    scenario = _scenario(folder)
    mode = summary.get("mode") or scenario.get("mode") or "fl"
    kind = MODES.get(mode)
    if kind is None or kind.audit is None:
        raise NotAudited(f"{folder} is a {mode} run: emu audit checks {', '.join(AUDITED)} runs")
    fields, problems = resolve(kind.audit)(events, summary, finished, scenario)
    return {"run": str(folder), "mode": mode, "finished": finished, "runtime": summary.get("runtime"),
            **fields, "faults": dict(sorted(faults.items())), "frames_rejected": _frames(events),
            "torn_event_lines": torn, "lost_data": len(problems), "problems": problems[:20],
            "final_accuracy": summary.get("final_accuracy")}


def _frames(events: list[dict]) -> dict:
    """Transport frames refused, by reason (the collectives' carry only their error)."""
    frames = Counter(e.get("reason") or e.get("error", "")[:40] for e in events if e["kind"] == ev.FRAME_REJECTED)
    return dict(sorted(frames.items()))


def _scenario(folder: Path) -> dict:
    """The run's scenario.json ({} if it has none)."""
    for path in (folder / "scenario.json", folder / "rank0" / "scenario.json"):
        if path.exists():
            return json.loads(path.read_text())
    return {}


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
