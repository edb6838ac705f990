"""The federated-learning report: bytes, communication time, round time and accuracy per run.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dtemu.core import events as kinds
from dtemu.core.wire.topics import MODEL_BLOB
from dtemu.report.runs import (Run, _bar_panel, _colors, _fmt, _mean, _nan, _write_report, human_bytes,
                               run_labels)


def fl_bytes_per_update(run: Run) -> float | None:
    """Mean size of an accepted update on the wire (the whole ClientUpdate message)."""
    return _mean(ev.get("bytes") for ev in run.of(kinds.UPDATE_ACCEPTED))


def fl_bytes_per_round(run: Run) -> float | None:
    """Client traffic, both ways, per completed round."""
    rounds = run.summary.get("rounds") or 0
    if rounds <= 0:
        return None
    return (run.summary.get("bytes_up", 0) + run.summary.get("bytes_down", 0)) / rounds


def fl_upload_comm_by_client(run: Run) -> dict[str, float]:
    """Mean seconds from a client's send to the controller's receipt, per client."""
    per: dict[str, list[float]] = defaultdict(list)
    for ev in run.of(kinds.UPDATE_ACCEPTED):
        per[ev.get("client")].append(ev.get("comm_s"))
    return {c: m for c, v in per.items() if (m := _mean(v)) is not None}


def fl_download_comm_by_client(run: Run) -> dict[str, float]:
    """Mean seconds for the controller's model to reach each client."""
    per: dict[str, list[float]] = defaultdict(list)
    for ev in run.of(kinds.DELIVER):
        if ev.get("topic") == MODEL_BLOB:
            per[ev.get("node")].append(ev.get("comm_s"))
    return {c: m for c, v in per.items() if (m := _mean(v)) is not None}


def fl_round_times(run: Run) -> list[tuple[int, int, float]]:
    """(round, attempt, seconds from round_start to round_close), in order.

    A retried round appears once per attempt: each attempt waited for its own updates.
    """
    open_: dict[int, tuple[float, int]] = {}
    times = []
    for ev in run.of(kinds.ROUND_START, kinds.ROUND_CLOSE):
        r = ev.get("round")
        if ev["kind"] == kinds.ROUND_START:
            open_[r] = (ev["t"], ev.get("attempt", 0))
        elif r in open_:
            start, attempt = open_.pop(r)
            times.append((r, attempt, ev["t"] - start))
    return times


def fl_accuracy_curve(run: Run) -> list[tuple[int, float]]:
    return [(ev["round"], ev["accuracy"]) for ev in run.of(kinds.EVAL) if ev.get("accuracy") is not None]


def _fp32_reference(run: Run, runs: list[Run], per_update: dict[int, float | None]) -> Run | None:
    """The fp32 run to compare ``run`` with: same scenario and runtime, else same scenario,
    else the only fp32 run there is."""
    fp32 = [r for r in runs if r.codec == "fp32" and per_update[id(r)]]
    for same in (lambda r: (r.name, r.runtime) == (run.name, run.runtime), lambda r: r.name == run.name):
        matches = [r for r in fp32 if same(r)]
        if matches:
            return matches[0]
    return fp32[0] if len(fp32) == 1 else None


def fl_table(runs: list[Run]) -> list[dict]:
    """One row per run; ``vs_fp32`` is bytes per update over the fp32 run's (fp32 = 1.0)."""
    per_update = {id(r): fl_bytes_per_update(r) for r in runs}
    rows = []
    for run, label in zip(runs, run_labels(runs)):
        ref = _fp32_reference(run, runs, per_update)
        mine = per_update[id(run)]
        clock, seconds = run.clock
        rows.append({
            "label": label,
            "runtime": run.runtime,
            "codec": run.codec,
            "rounds": run.summary.get("rounds"),
            "rounds_failed": run.summary.get("rounds_failed", 0),
            "final_accuracy": run.summary.get("final_accuracy"),
            "bytes_per_update": mine,
            "bytes_per_round": fl_bytes_per_round(run),
            "vs_fp32": mine / per_update[id(ref)] if ref is not None and mine is not None else None,
            "upload_comm_s": _mean(ev.get("comm_s") for ev in run.of(kinds.UPDATE_ACCEPTED)),
            "round_time_s": _mean(s for _, _, s in fl_round_times(run)),
            "time_s": seconds,
            "clock": clock,
        })
    return rows


def fl_markdown(rows: list[dict]) -> str:
    header = ("| run | runtime | rounds | final accuracy | bytes/update | bytes/round | vs fp32 "
              "| upload comm (s) | round time (s) | run time (s) |")
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        time_s = "n/a" if row["time_s"] is None else f"{row['time_s']:.3f} ({row['clock']})"
        lines.append("| " + " | ".join([
            row["label"],
            row["runtime"],
            _fmt(row["rounds"], "d"),
            _fmt(row["final_accuracy"], ".4f"),
            _fmt(row["bytes_per_update"], ",.0f"),
            _fmt(row["bytes_per_round"], ",.0f"),
            _fmt(row["vs_fp32"], ".3f"),
            _fmt(row["upload_comm_s"], ".4f"),
            _fmt(row["round_time_s"], ".3f"),
            time_s,
        ]) + " |")
    return "\n".join(lines) + "\n"


def plot_fl_bytes(runs: list[Run]) -> Figure:
    labels, colors = run_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    _bar_panel(left, labels, [fl_bytes_per_update(r) for r in runs], colors,
               "bytes per update", "bytes", human_bytes)
    _bar_panel(right, labels, [fl_bytes_per_round(r) for r in runs], colors,
               "bytes per round (up + down, all clients)", "bytes", human_bytes)
    fig.suptitle("communication volume per codec")
    return fig


def plot_fl_comm_time(runs: list[Run]) -> Figure:
    labels, colors = run_labels(runs), _colors(len(runs))
    clients: list[str] = []
    for run in runs:
        clients += [c for c in run.client_names() if c not in clients]
    # Wide enough that every (client, run) bar stays visible.
    fig = Figure(figsize=(min(20.0, max(9.0, 4 + 0.6 * len(clients) * len(runs))), 4.5),
                 layout="constrained")
    axes = fig.subplots(1, 2, sharey=False)
    width = 0.8 / max(1, len(runs))
    panels = (("upload (client → controller)", fl_upload_comm_by_client),
              ("download (model → client)", fl_download_comm_by_client))
    for ax, (title, per_client) in zip(axes, panels):
        for i, (run, label, color) in enumerate(zip(runs, labels, colors)):
            means = per_client(run)
            xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(clients))]
            ax.bar(xs, [_nan(means.get(c)) for c in clients], width, label=label, color=color)
        ax.set_xticks(range(len(clients)), clients, rotation=20)
        ax.set_title(title)
        ax.set_ylabel("mean seconds")
    axes[0].legend(fontsize=8)
    fig.suptitle("communication time per client")
    return fig


def plot_fl_round_time(runs: list[Run]) -> Figure:
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    for run, label, color in zip(runs, run_labels(runs), _colors(len(runs))):
        times = fl_round_times(run)
        ax.plot([r for r, _, _ in times], [s for _, _, s in times], marker="o", markersize=3,
                label=label, color=color)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("seconds (round_start → round_close)")
    ax.set_title("round time")
    ax.legend(fontsize=8)
    return fig


def plot_fl_accuracy(runs: list[Run]) -> Figure:
    labels, colors = run_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    finals = [r.summary.get("final_accuracy") for r in runs]
    _bar_panel(left, labels, finals, colors, "final accuracy", "accuracy",
               lambda v: "n/a" if v is None else f"{v:.4f}", allow_log=False)
    left.set_ylim(0, 1.05)
    for run, label, color in zip(runs, labels, colors):
        curve = fl_accuracy_curve(run)
        right.plot([r for r, _ in curve], [a for _, a in curve], marker="o", markersize=3,
                   label=label, color=color)
    right.set_xlabel("round")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylabel("accuracy")
    right.set_title("accuracy over rounds")
    right.legend(fontsize=8)
    return fig


FL_FIGURES: dict[str, Callable[[list[Run]], Figure]] = {
    "bytes.png": plot_fl_bytes,
    "comm_time.png": plot_fl_comm_time,
    "round_time.png": plot_fl_round_time,
    "accuracy.png": plot_fl_accuracy,
}


def write_fl_report(runs: list[Run], out: Path) -> tuple[list[Path], str]:
    """The four codec-comparison figures and report.md; returns the files and the table."""
    table = fl_markdown(fl_table(runs))
    return _write_report(runs, out, FL_FIGURES, table, "report.md",
                         "# Federated learning: codec comparison\n\n" + table)
