"""Audit a ps run folder (mode ps: ESync and its baselines), emu or real: what faults it met and
whether anything was lost or counted twice.  ``emu audit`` calls it for ps runs.

The parameter server may die and resume from its checkpoint; each start (``run_start``) is a life.
Checks:

- in each life, the synchronous rounds that made a model (``ps_round`` with ``aggregated``) have
  the versions from where that life began, once each and in order (a resumed server redoes only
  what its checkpoint had not saved); a finished run made every version up to its last;
- the summary's update tallies are the last life's events (accepted, and each refusal by reason),
  and so is the server's own ``run_end`` record;
- no worker's updates were taken more often than it sent them (pushes and re-sends);
- the final model is the one the last life ended with.
"""

from __future__ import annotations

from collections import Counter

from dtemu.core import events as ev

PS = "ps"


def _lives(events: list[dict]) -> list[dict]:
    """The parameter server's lives: where each began, the versions its rounds made, its tallies."""
    lives: list[dict] = []
    for e in events:
        if e.get("node") != PS:
            continue
        kind = e["kind"]
        if kind == ev.RUN_START:
            lives.append({"first": e.get("first_round", 0), "made": [], "counts": Counter(), "end": None,
                          "suppressed": 0})
        elif not lives:
            continue
        elif kind == ev.PS_ROUND and e.get("aggregated"):
            lives[-1]["made"].append(e["version"])
        elif kind == ev.PS_UPDATE:
            lives[-1]["counts"]["accepted"] += 1
        elif kind == ev.UPDATE_REJECTED:
            lives[-1]["counts"][e.get("reason", "?")] += 1
        elif kind == ev.EVENTS_SUPPRESSED and e.get("of") == ev.UPDATE_REJECTED:
            lives[-1]["suppressed"] += e.get("suppressed", 0)
        elif kind == ev.RUN_END:
            lives[-1]["end"] = e
    return lives


def check_ps(events: list[dict], summary: dict, finished: bool, scenario: dict) -> tuple[dict, list[str]]:
    """What ``emu audit`` adds for a ps run: its fields, and the problems found."""
    problems: list[str] = []
    lives = _lives(events)
    for n, life in enumerate(lives, 1):
        made = life["made"]
        if made != list(range(life["first"], life["first"] + len(made))):
            problems.append(f"the parameter server's life {n} made versions {made[:8]}{'...' if len(made) > 8 else ''}, "
                            f"not {life['first']} onwards once each")
    if finished and summary.get("stop_reason") == "done" and any(life["made"] for life in lives):
        missing = set(range(summary.get("rounds", 0))) - {v for life in lives for v in life["made"]}
        if missing:
            problems.append(f"no round made version(s) {sorted(missing)[:8]}")
    last = lives[-1] if lives else None
    if last is not None and not last["suppressed"]:
        counts = dict(last["counts"])
        if summary.get("updates") is not None and counts != summary["updates"]:
            problems.append(f"summary counts {summary['updates']} but the events say {counts}")
        if last["end"] is not None and last["end"].get("counts") not in (None, counts):
            problems.append(f"the server's run_end counts {last['end']['counts']} but its events say {counts}")
    taken = Counter(e["worker"] for e in events if e["kind"] == ev.PS_UPDATE and e.get("node") == PS)
    sent = Counter(e["node"] for e in events if e["kind"] in (ev.PS_WORKER_ROUND, ev.UPDATE_RESENT))
    for worker, n in sorted(taken.items()):
        if n > sent[worker]:
            problems.append(f"{n} updates of {worker} taken, {sent[worker]} sent")
    if finished and last is not None and last["end"] is not None \
            and summary.get("model_sha256") != last["end"].get("model_sha256"):
        problems.append("the final model is not the one the parameter server ended with")
    return {
        "rounds": summary.get("rounds"),
        "rounds_failed": summary.get("rounds_failed"),
        "updates": dict(sorted(last["counts"].items())) if last else {},
        "updates_taken_per_worker": dict(sorted(taken.items())),
        "server_lives": len(lives),
        "refusals_only_counted": last["suppressed"] if last else 0,
    }, problems
