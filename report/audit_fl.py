"""The audit of an FL run (``emu audit``; report.audit runs it for mode fl).

Counts rounds completed and failed, updates accepted / rejected (by reason) / late /
duplicate.  Then checks that nothing was lost or counted twice:

- every round up to the last is closed and checkpointed exactly once, in order
  (a controller restarted from its checkpoint redoes only unsaved rounds);
- every update aggregated into a saved round was accepted in that round, and
  the clients a saved round names are the ones accepted in its last attempt;
- the summary's tallies are the events' (nothing counted but not logged);
- the final model is the one the last aggregation or resume produced.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from dtemu.core import events as ev


def check_fl(events: list[dict], summary: dict, finished: bool, scenario: dict) -> tuple[dict, list[str]]:
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
    planned = (scenario.get("fl") or {}).get("rounds")
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
    fields = {
        "rounds": summary.get("rounds"),
        "rounds_failed": summary.get("rounds_failed"),
        "updates": dict(sorted(counts.items())),
        "redone": dict(sorted(redone.items())),  # tallied in rounds a crash undid (done again)
        "controller_lives": life,
        "refusals_only_counted": suppressed,
    }
    return fields, problems
