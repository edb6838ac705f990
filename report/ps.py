"""The ps report (``mode: ps``, issue 10): ESync and its baselines side by side.

What a reader of an ESync-style comparison asks, per run: when each target accuracy was first
reached, how accuracy and test loss grew over time, and per worker how many local iterations it ran
a round, how long it sat blocked waiting for the next model, how long it computed, and how many
bytes it moved.  All of it is read from the run folder: ``summary.json`` (``time_to_accuracy``,
``blocking_time_s``, ``iterations_per_round``, ``bytes_per_node``, ``samples_per_s``) and the
events (the parameter server's ``eval``, the workers' ``ps_worker_round``), so a run killed half
way is reported from its events as far as it got.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure

from dtemu.core import events as kinds
from dtemu.report.runs import Run, _colors, _flat, _fmt, _line_styles, _log_if_wide, _mean, _write_report, \
    differing_keys, human_bytes, plot_time_to_accuracy, time_to_accuracy, tta_text

PS_NODE = "ps"
# What tells runs of one algorithm apart, when it is the only difference shown.
_ALGORITHM_KEYS = {"fedasync": "ps.staleness", "feddrop": "ps.feddrop_k_hat"}


def ps_hc(run: Run) -> str:
    """h_c: the slowest worker's slowdown over the fastest's (the scenario's fixed slowdowns)."""
    nodes = (run.scenario.get("compute") or {}).get("nodes") or {}
    workers = ps_spec(run).get("workers") or 0
    slow = [float((nodes.get(f"worker{k}") or {}).get("slowdown", 1.0) or 1.0) for k in range(1, workers + 1)]
    return f"{max(slow) / min(slow):g}" if slow and min(slow) > 0 else "?"


_FEATURES = [("h_c", ps_hc), ("model", lambda r: r.scenario.get("model")),
             ("lr", lambda r: ps_spec(r).get("lr")),
             ("data", lambda r: (r.scenario.get("data") or {}).get("partition")),
             ("cap", lambda r: ps_spec(r).get("max_local_iterations")),
             ("fixed", lambda r: ps_spec(r).get("fixed_iterations"))]
_SHOWN = {"ps.algorithm", "ps.staleness", "ps.feddrop_k_hat", "model", "ps.lr", "data.partition",
          "ps.max_local_iterations", "ps.fixed_iterations"}


def ps_spec(run: Run) -> dict:
    return run.scenario.get("ps") or {}


def ps_algorithm(run: Run) -> str:
    return run.summary.get("algorithm") or ps_spec(run).get("algorithm") or "?"


def ps_labels(runs: list[Run]) -> list[str]:
    """"esync", "fedasync poly", "feddrop 6", plus the runtime or the keys that differ where needed."""
    labels = []
    for run in runs:
        algorithm, key = ps_algorithm(run), _ALGORITHM_KEYS.get(ps_algorithm(run))
        extra = _flat(run.scenario).get(key) if key else None
        labels.append(f"{algorithm} {extra}" if extra is not None else algorithm)
    if len({r.runtime for r in runs}) > 1:
        labels = [f"{label} ({r.runtime})" for r, label in zip(runs, labels)]
    for name, part in _FEATURES:   # what an ESync comparison varies, where the runs differ in it
        if len({part(r) for r in runs}) > 1:
            labels = [label if part(r) is None else f"{label} {name}={part(r)}" for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):   # else the first other scenario keys that differ
        keys = [k for k in differing_keys(runs) if k not in _SHOWN and not k.startswith("compute.")]
        if keys:
            labels = [label + "".join(f" {k.split('.', 1)[-1]}={_flat(r.scenario).get(k)}" for k in keys[:2])
                      for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} [{r.path.name}]" for r, label in zip(runs, labels)]
    return [label + ("" if r.finished else " (unfinished)") for r, label in zip(runs, labels)]


def ps_curve(run: Run) -> list[tuple[float, int | None, float, float | None]]:
    """(time, version, accuracy, test loss) of the parameter server's evaluations, in order."""
    return [(ev.get("t", 0.0), ev.get("round"), ev["accuracy"], ev.get("loss")) for ev in run.of(kinds.EVAL)
            if ev.get("node", PS_NODE) == PS_NODE and ev.get("accuracy") is not None]


def ps_time_to_accuracy(run: Run) -> dict[str, float | None]:
    """The summary's map, else (unfinished run) the first evaluation at or above each target."""
    return time_to_accuracy(run, [(t, a) for t, _, a, _ in ps_curve(run)])


def ps_worker_rounds(run: Run) -> dict[str, list[dict]]:
    """Per worker, its ``ps_worker_round`` events in order: one per update it pushed."""
    out: dict[str, list[dict]] = defaultdict(list)
    for ev in run.of(kinds.PS_WORKER_ROUND):
        out[ev.get("node", "?")].append(ev)
    return dict(out)


def _worker_order(name: str):
    digits = "".join(ch for ch in name if ch.isdigit())
    return (name.rstrip("0123456789"), int(digits) if digits else 0)


def ps_workers(run: Run) -> list[dict]:
    """Per worker: updates pushed, local iterations (in all, per update), blocking, compute and mean
    transfer time (m_k) in seconds, bytes sent and received.  The summary's numbers where it has
    them; the events' (as far as the run got) otherwise."""
    rounds = ps_worker_rounds(run)
    names = sorted(set(rounds) | set(run.summary.get("blocking_time_s") or {}), key=_worker_order)
    per_node = run.summary.get("bytes_per_node") or {}
    rows = []
    for name in names:
        evs = rounds.get(name, [])
        iterations = sum(ev.get("iterations", 0) for ev in evs)
        summary_ipr = (run.summary.get("iterations_per_round") or {}).get(name)
        blocked = (run.summary.get("blocking_time_s") or {}).get(name)
        rows.append({
            "node": name, "updates": len(evs),
            "iterations": (run.summary.get("local_iterations") or {}).get(name, iterations),
            "per_round": summary_ipr if summary_ipr is not None else (iterations / len(evs) if evs else None),
            "blocking_s": blocked if blocked is not None else sum(ev.get("blocked_s", 0.0) for ev in evs),
            "compute_s": evs[-1].get("compute_s") if evs else None,
            "m_s": _mean(ev.get("m") for ev in evs),
            "sent": (per_node.get(name) or {}).get("sent"), "received": (per_node.get(name) or {}).get("received"),
        })
    return rows


def ps_table(runs: list[Run]) -> list[dict]:
    rows = []
    for run, label in zip(runs, ps_labels(runs)):
        curve, workers = ps_curve(run), ps_workers(run)
        per_round = [w["per_round"] for w in workers if w["per_round"] is not None]
        clock, seconds = run.clock
        rows.append({
            "label": label, "runtime": run.runtime, "algorithm": ps_algorithm(run),
            "versions": run.summary.get("rounds", max((v for _, v, _, _ in curve if v is not None), default=None)),
            "final_accuracy": run.summary.get("final_accuracy", curve[-1][2] if curve else None),
            "final_loss": run.summary.get("final_loss", curve[-1][3] if curve else None),
            "time_to_accuracy": ps_time_to_accuracy(run),
            "iterations_min": min(per_round, default=None), "iterations_max": max(per_round, default=None),
            "blocking_mean": _mean(w["blocking_s"] for w in workers),
            "samples_per_s": run.summary.get("samples_per_s"),
            "bytes_per_worker": _mean((w["sent"] or 0) + (w["received"] or 0) for w in workers
                                      if w["sent"] is not None),
            "stop_reason": run.summary.get("stop_reason"), "time_s": seconds, "clock": clock,
        })
    return rows


def ps_markdown(rows: list[dict]) -> str:
    header = ("| run | runtime | versions | final accuracy | final test loss | time to accuracy (s) "
              "| local iterations a round (min-max over workers) | blocking per worker (mean, s) | samples/s "
              "| bytes per worker (sent + received) | stop | run time (s) |")
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        lo, hi = row["iterations_min"], row["iterations_max"]
        iterations = "n/a" if lo is None else (f"{lo:.1f}" if lo == hi else f"{lo:.1f}-{hi:.1f}")
        lines.append("| " + " | ".join([
            row["label"], row["runtime"], _fmt(row["versions"], "d"), _fmt(row["final_accuracy"], ".4f"),
            _fmt(row["final_loss"], ".4f"), tta_text(row["time_to_accuracy"]), iterations,
            _fmt(row["blocking_mean"], ".3f"), _fmt(row["samples_per_s"], ",.0f"), human_bytes(row["bytes_per_worker"]),
            row["stop_reason"] or "n/a", "n/a" if row["time_s"] is None else f"{row['time_s']:.2f} ({row['clock']})",
        ]) + " |")
    return "\n".join(lines) + "\n"


def ps_workers_markdown(runs: list[Run]) -> str:
    lines = ["| run | worker | updates pushed | local iterations in all (per update) | blocking (s) | compute (s) | m_k mean (ms) "
             "| sent / received |", "|---" * 8 + "|"]
    for run, label in zip(runs, ps_labels(runs)):
        for w in ps_workers(run):
            lines.append(f"| {label} | {w['node']} | {w['updates']} | {w['iterations']} ({_fmt(w['per_round'], '.1f')})"
                         f" | {_fmt(w['blocking_s'], '.3f')} | {_fmt(w['compute_s'], '.3f')} "
                         f"| {_fmt(None if w['m_s'] is None else w['m_s'] * 1000, '.2f')} "
                         f"| {human_bytes(w['sent'])} / {human_bytes(w['received'])} |")
    return "\n".join(lines) + "\n"


PS_NOTES = """
A version is a global model the parameter server made: a round of a synchronous algorithm, an
applied update of an asynchronous one.  Local iterations a round: per worker, the mean over the
updates it pushed (ESync's fast workers run many, its stragglers one).  Blocking: the time a worker
waited for the next model after pushing, less that model's own transfer (ESync's d_wait).  m_k is
a worker's measured one-way transfer time of the model.  Time is the run's own clock (virtual in
emu).  Time to accuracy is the first evaluation of the parameter server at or above each target
(`targets` in the scenario), so it is as coarse as `ps.eval_every`.
"""


def _wide(values) -> bool:
    present = [v for v in values if v and v > 0]
    return bool(present) and max(present) / min(present) > 100


def plot_ps_accuracy(runs: list[Run]) -> Figure:
    """Accuracy and test loss over time; a log time axis when the runs' spans differ a hundredfold
    (ESync's seconds beside SSGD's minutes)."""
    labels, colors = ps_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    targets = sorted({float(t) for r in runs for t in ps_time_to_accuracy(r)})
    log_time = _wide([r.clock[1] for r in runs])
    for run, label, color, style in zip(runs, labels, colors, _line_styles(len(runs))):
        curve = [p for p in ps_curve(run) if p[0] > 0 or not log_time]   # t = 0 has no place on a log axis
        left.plot([t for t, *_ in curve], [a for _, _, a, _ in curve], label=label, color=color, linestyle=style)
        right.plot([t for t, *_ in curve], [x for *_, x in curve], label=label, color=color, linestyle=style)
    for ax, ylabel in ((left, "test accuracy"), (right, "test loss")):
        if log_time:
            ax.set_xscale("log")
        ax.set_xlabel(f"time ({runs[0].clock[0] if runs else 'sim'}, s)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    for t in targets:
        left.axhline(t, color="0.6", linestyle=":", linewidth=1)
    left.set_title("accuracy over time (dotted: targets)")
    right.set_title("test loss over time")
    if runs:
        left.legend(fontsize=8)
    return fig


def plot_ps_time_to_accuracy(runs: list[Run]) -> Figure:
    return plot_time_to_accuracy(runs, ps_labels(runs), ps_time_to_accuracy, ".2f")


def plot_ps_workers(runs: list[Run]) -> Figure:
    """Per worker, grouped by run: local iterations a round, and blocking time."""
    labels, colors = ps_labels(runs), _colors(len(runs))
    tables = [ps_workers(r) for r in runs]
    names = sorted({w["node"] for t in tables for w in t}, key=_worker_order)
    fig = Figure(figsize=(min(16, max(8, 0.25 * len(names) * max(len(runs), 1) + 4)), 7), layout="constrained")
    top, bottom = fig.subplots(2, 1)
    width = 0.8 / max(len(runs), 1)
    for ax, key, ylabel in ((top, "per_round", "local iterations a round"), (bottom, "blocking_s", "blocking (s)")):
        values = []
        for j, (table, label, color) in enumerate(zip(tables, labels, colors)):
            by = {w["node"]: w[key] for w in table}
            ys = [by.get(n) for n in names]
            values += ys
            ax.bar([i + (j - (len(runs) - 1) / 2) * width for i in range(len(names))],
                   [float("nan") if y is None else y for y in ys], width, color=color, label=label)
        _log_if_wide(ax, values)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    top.set_title("per worker: local iterations a round (mean over its updates)")
    bottom.set_title("per worker: time blocked waiting for the next model, less its transfer")
    if runs:
        top.legend(fontsize=8)
    return fig


def plot_ps_rounds(runs: list[Run]) -> Figure:
    """Each worker's local iterations, update by update: ESync re-deciding as speeds change."""
    shown = runs[:6]
    fig = Figure(figsize=(6 * min(max(len(shown), 1), 3), 4 * ((max(len(shown), 1) + 2) // 3)), layout="constrained")
    axes = fig.subplots((max(len(shown), 1) + 2) // 3, min(max(len(shown), 1), 3), squeeze=False).flat
    for ax, run, label in zip(axes, shown, ps_labels(runs)):
        values = []
        for name, evs in sorted(ps_worker_rounds(run).items(), key=lambda kv: _worker_order(kv[0])):
            ax.plot([ev.get("t", 0.0) for ev in evs], [ev.get("iterations", 0) for ev in evs], linewidth=1,
                    marker=".", markersize=3, label=name)
            values += [ev.get("iterations", 0) for ev in evs]
        _log_if_wide(ax, values)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel(f"time of the push ({run.clock[0]}, s)")
        ax.set_ylabel("local iterations of the update")
        ax.grid(True, alpha=0.3)
        if values:
            ax.legend(fontsize=6, ncols=2)
    return fig


PS_FIGURES: dict[str, Callable[[list[Run]], Figure]] = {
    "ps_accuracy.png": plot_ps_accuracy,
    "ps_time_to_accuracy.png": plot_ps_time_to_accuracy,
    "ps_workers.png": plot_ps_workers,
    "ps_rounds.png": plot_ps_rounds,
}


def write_ps_report(runs: list[Run], out: Path) -> tuple[list[Path], str]:
    """The four ps figures and ps.md; returns the files and the table."""
    table = ps_markdown(ps_table(runs))
    text = ("# Workers of very different speeds (ps)\n\n" + table + "\n## Per worker\n\n" + ps_workers_markdown(runs)
            + PS_NOTES)
    return _write_report(runs, out, PS_FIGURES, table, "ps.md", text)
