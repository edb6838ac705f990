"""Audit a geo run folder (mode geo: HiPS, the flat PS), emu or real: what faults it met, which
nodes were given up, and whether the summary says what the events say.  ``emu audit`` calls it for
geo runs.

Checks:

- the root parameter server (the global PS, or the flat PS) closed rounds 1, 2, ... once each and in
  order (MixedSync: one per site update), as many as the summary's ``rounds`` in a finished run;
- each local PS closed its rounds in order, once each, within each of its lives (a site that joins,
  or a local PS that starts again, begins past 1);
- the nodes the summary lists as ``lost`` are the ones some role gave up (``geo_lost``) and did not
  let back in (``geo_join``), and its ``rejected`` is the payloads refused (``message_rejected``);
- the master ended with the summary's model and round count.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from dtemu.core import events as ev
from dtemu.core.geo.spec import FLAT_PS, GLOBAL_PS, MASTER

ROOTS = (GLOBAL_PS, FLAT_PS)


def _closes(events: list[dict]) -> dict[str, list[list[int]]]:
    """Per PS, the rounds it closed (``geo_round``), one list per life (a ``node_up`` starts one)."""
    lives: dict[str, list[list[int]]] = defaultdict(list)
    for e in events:
        node = e.get("node")
        if e["kind"] == ev.NODE_UP:
            lives[node].append([])
        elif e["kind"] == ev.GEO_ROUND:
            if not lives[node]:
                lives[node].append([])
            lives[node][-1].append(e["round"])
    return {node: [life for life in ls if life] for node, ls in lives.items() if any(ls)}


def _still_lost(events: list[dict]) -> list[str]:
    """The nodes some role gave up (``geo_lost``) and did not let back in (its ``geo_join``)."""
    lost: dict[str, set] = defaultdict(set)
    for e in events:
        if e["kind"] == ev.GEO_LOST:
            lost[e.get("node")] |= set(e.get("missing", []))
        elif e["kind"] == ev.GEO_JOIN:
            lost[e.get("node")].discard(e.get("ps"))
    return sorted(set().union(*lost.values())) if lost else []


def check_geo(events: list[dict], summary: dict, finished: bool, scenario: dict) -> tuple[dict, list[str]]:
    """What ``emu audit`` adds for a geo run: its fields, and the problems found."""
    problems: list[str] = []
    closes = _closes(events)
    for node, lives in sorted(closes.items()):
        for n, rounds in enumerate(lives, 1):
            root = node in ROOTS
            first = 1 if root and n == 1 else rounds[0]
            if rounds != list(range(first, first + len(rounds))):
                problems.append(f"{node} (life {n}) closed rounds {rounds[:8]}{'...' if len(rounds) > 8 else ''}, "
                                f"not {first} onwards once each")
    root_rounds = [r for node in ROOTS for life in closes.get(node, []) for r in life]
    if finished and summary.get("stop_reason") == "done" and root_rounds \
            and max(root_rounds) != summary.get("rounds"):
        problems.append(f"the root PS closed {max(root_rounds)} rounds, the summary says {summary.get('rounds')}")
    given_up = _still_lost(events)
    if finished and sorted(summary.get("lost") or []) != given_up:
        problems.append(f"the summary lists {summary.get('lost')} as lost, the roles gave up {given_up}")
    refused = Counter(e.get("reason") for e in events if e["kind"] == ev.MESSAGE_REJECTED)
    suppressed = sum(e.get("suppressed", 0) for e in events
                     if e["kind"] == ev.EVENTS_SUPPRESSED and e.get("of") == ev.MESSAGE_REJECTED)
    if finished and not suppressed and summary.get("rejected") is not None \
            and summary["rejected"] != sum(refused.values()):
        problems.append(f"the summary counts {summary['rejected']} refused payloads, the events {sum(refused.values())}")
    master = [e for e in events if e["kind"] == ev.GEO_END and e.get("node") == MASTER]
    if finished and master:
        if master[-1].get("model_sha256") != summary.get("model_sha256"):
            problems.append("the summary's model is not the one the master ended with")
        if master[-1].get("rounds") != summary.get("rounds"):
            problems.append(f"the master ended after {master[-1].get('rounds')} rounds, "
                            f"the summary says {summary.get('rounds')}")
    return {
        "rounds": summary.get("rounds"),
        "lost": given_up,
        "joined": sorted({e.get("site") for e in events if e["kind"] == ev.GEO_JOIN}),
        "payloads_rejected": dict(sorted(refused.items())),
        "refusals_only_counted": suppressed,
    }, problems
