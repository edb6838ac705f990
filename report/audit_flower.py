"""The audit of a Flower app's run (``emu audit``; mode flower names it): what the server took, and
that nothing a client answered was lost on the way without a cause.

- the summary's tallies of train replies (accepted, late, refused by reason, the ClientApp's errors)
  are the server's events';
- every reply a client sent (a ``flower_call`` that was not hung) reached the server's inbox (taken,
  late, refused or an error reply) or was lost to a fault of the scenario (message_lost, partition)
  or to the run's end; the rest is lost data.
"""

from __future__ import annotations

from collections import Counter

from dtemu.core import events as ev
from dtemu.core.flower.replies import is_train

SERVER = "server"


def check_flower(events: list[dict], summary: dict, finished: bool, scenario: dict) -> tuple[dict, list[str]]:
    problems: list[str] = []
    server = [e for e in events if e["node"] == SERVER]
    counts = Counter()
    heard = Counter()  # (client, round) -> replies the server's inbox saw
    for e in server:
        k = e["kind"]
        if k == ev.UPDATE_ACCEPTED:
            counts["accepted"] += 1
        elif k == ev.UPDATE_LATE:
            counts["late"] += 1
        elif k == ev.UPDATE_REJECTED:
            counts[e.get("reason", "rejected")] += 1
        if k in (ev.UPDATE_ACCEPTED, ev.UPDATE_LATE, ev.UPDATE_REJECTED) and "client" in e:
            heard[(e["client"], e.get("round"))] += 1
    lost_on_way = sum(1 for e in server if e["kind"] == ev.FAULT and e.get("fault") in ("message_lost", "partition"))
    sent = Counter((e["node"], e["round"]) for e in events
                   if e["kind"] == ev.FLOWER_CALL and is_train(str(e.get("type", ""))))
    unheard = sum(max(0, n - heard[key]) for key, n in sent.items())
    lost = max(0, unheard - lost_on_way) if finished else 0
    tallied = {k: v for k, v in (summary.get("updates") or {}).items() if k != "evaluated"}
    suppressed = sum(e["suppressed"] for e in server if e["kind"] == ev.EVENTS_SUPPRESSED)
    if finished and not suppressed and tallied != dict(counts):
        problems.append(f"summary counts {tallied} but the events say {dict(counts)}")
    if lost:
        problems.append(f"{lost} train replies sent by clients never reached the server, and no fault explains them")
    fields = {"rounds": summary.get("rounds"), "rounds_failed": summary.get("rounds_failed"),
              "updates": dict(sorted(counts.items())), "train_replies_sent": sum(sent.values()),
              "lost_to_faults": lost_on_way, "lost_data": lost,
              "client_app_failures": sum(1 for e in events if e["kind"] == ev.CLIENT_APP_FAILED),
              "final_accuracy": summary.get("final_accuracy")}
    return fields, problems
