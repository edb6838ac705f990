"""Audit a ddp run folder (mode ddp: allreduce or DGC), emu or real: what faults it met, which ranks
were lost, and whether the summary says what the events say.  ``emu audit`` calls it for ddp runs.

Checks:

- each worker stepped 0, 1, 2, ... once each and in order within each of its lives (a step whose
  exchange failed is not logged; a regrouping sets the step the group goes on from, so a worker
  that was apart may skip ahead or redo one);
- a worker's ``worker_end`` is after its last logged step and counts the bytes of its steps;
- the ranks the summary lists as lost are those some worker lost (``worker_lost``) and those that
  never ended (or never started);
- the survivors ended with one model, the summary's, after the summary's number of steps.
"""

from __future__ import annotations

from collections import defaultdict

from dtemu.core import events as ev


def _lives(events: list[dict]) -> dict[str, list[list[dict]]]:
    """Per worker, its ``step`` and ``membership`` events, one list per life (a ``worker_start``
    begins one)."""
    lives: dict[str, list[list[dict]]] = defaultdict(list)
    for e in events:
        if e["kind"] == ev.WORKER_START:
            lives[e["node"]].append([])
        elif e["kind"] in (ev.STEP, ev.MEMBERSHIP) and lives[e["node"]]:
            lives[e["node"]][-1].append(e)
    return lives


def _out_of_order(life: list[dict]) -> list[int] | None:
    """The steps of a life, if they are not consecutive from 0 (a regrouping, ``membership``, sets
    where the group goes on: a worker that was apart may skip ahead or redo a step)."""
    expected, steps = 0, []
    for e in life:
        if e["kind"] == ev.MEMBERSHIP:
            expected = e.get("step", expected)
            continue
        steps.append(e["step"])
        if e["step"] != expected:
            return steps
        expected += 1
    return None


def check_ddp(events: list[dict], summary: dict, finished: bool, scenario: dict) -> tuple[dict, list[str]]:
    """What ``emu audit`` adds for a ddp run: its fields, and the problems found."""
    problems: list[str] = []
    lives = _lives(events)
    rank_of = {e["node"]: e["rank"] for e in events if e["kind"] == ev.WORKER_START}
    ends = {e["node"]: e for e in events if e["kind"] == ev.WORKER_END}
    for node, node_lives in sorted(lives.items()):
        for n, life in enumerate(node_lives, 1):
            if (bad := _out_of_order(life)) is not None:
                problems.append(f"{node} (life {n}) stepped ...{bad[-8:]}: not in order, once each")
        end = ends.get(node)
        last = [e for e in (node_lives[-1] if node_lives else []) if e["kind"] == ev.STEP]
        if end is not None and last:
            if end.get("steps") != last[-1]["step"] + 1:
                problems.append(f"{node} ended after {end.get('steps')} steps, its last logged was {last[-1]['step']}")
            if end.get("bytes_sent") != sum(e["bytes_sent"] for e in last):
                problems.append(f"{node} counts {end.get('bytes_sent')} bytes sent, its steps {sum(e['bytes_sent'] for e in last)}")
    lost = {r for e in events if e["kind"] == ev.WORKER_LOST for r in e.get("ranks", [])}
    world = max((e.get("world", 0) for e in events if e["kind"] == ev.WORKER_START), default=0)
    ended = {rank_of.get(node) for node in ends}
    lost |= {rank for rank in range(world) if rank not in ended}
    if finished and sorted(summary.get("lost_ranks") or []) != sorted(lost):
        problems.append(f"the summary lists ranks {summary.get('lost_ranks')} as lost, the events {sorted(lost)}")
    survivors = [end for node, end in ends.items() if rank_of.get(node) not in lost]
    if finished and survivors:
        models = {end.get("model_sha256") for end in survivors}
        if summary.get("models_agree") and models != {summary.get("model_sha256")}:
            problems.append("the survivors did not end with the summary's model")
        if summary.get("steps") != min(end.get("steps", 0) for end in survivors):
            problems.append(f"the summary says {summary.get('steps')} steps, the survivors ended after "
                            f"{sorted({end.get('steps') for end in survivors})}")
    return {"steps": summary.get("steps"), "lost_ranks": sorted(lost)}, problems
