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
                               mark_missing, run_labels, what_differs)


def fl_bytes_per_update(run: Run) -> float | None:
    """Mean size of an accepted update on the wire (the whole ClientUpdate message)."""
    return _mean(ev.get("bytes") for ev in run.of(kinds.UPDATE_ACCEPTED))


def fl_rounds_attempted(run: Run) -> int:
    """Rounds the controller closed, failed and retried ones included (each cost traffic)."""
    closed = len(run.of(kinds.ROUND_CLOSE))
    return closed or (run.summary.get("rounds") or 0) + (run.summary.get("rounds_failed") or 0)


def fl_total_bytes(run: Run) -> float | None:
    """Client traffic, both ways, over the whole run."""
    if "bytes_up" not in run.summary:
        return None
    return run.summary.get("bytes_up", 0) + run.summary.get("bytes_down", 0)


def fl_bytes_per_round(run: Run) -> float | None:
    """Client traffic, both ways, per round attempted (a failed round sent bytes too: dividing
    by the completed rounds would make a run with failures look twice as costly)."""
    attempted, total = fl_rounds_attempted(run), fl_total_bytes(run)
    if attempted <= 0 or total is None:
        return None
    return total / attempted


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
            "bytes_total": fl_total_bytes(run),
            "vs_fp32": mine / per_update[id(ref)] if ref is not None and mine is not None else None,
            "upload_comm_s": _mean(ev.get("comm_s") for ev in run.of(kinds.UPDATE_ACCEPTED)),
            "round_time_s": _mean(s for _, _, s in fl_round_times(run)),
            "time_s": seconds,
            "clock": clock,
        })
    return rows


def fl_markdown(rows: list[dict]) -> str:
    header = ("| run | runtime | rounds | final accuracy | bytes/update | bytes/round | bytes in all | vs fp32 "
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
            _fmt(row["bytes_total"], ",.0f"),
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
               "bytes per round attempted (up + down, all clients)", "bytes", human_bytes)
    for bar_x, total in enumerate(fl_total_bytes(r) for r in runs):
        if total is not None:
            right.annotate(f"in all {human_bytes(total)}", (bar_x, 0), xycoords=("data", "axes fraction"),
                           xytext=(0, 12), textcoords="offset points", ha="center", fontsize=7, color="0.3")
    fig.suptitle(f"communication volume per {what_differs(runs)}")
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
            mark_missing(ax, xs, [means.get(c) for c in clients])  # a client with nothing accepted
        ax.set_xticks(range(len(clients)), clients, rotation=20)
        ax.set_ylim(bottom=0)
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
    ax.set_ylim(bottom=0)  # from zero: a 0.15 s dip should look like one
    ax.set_title("round time")
    ax.legend(fontsize=8)
    return fig


def fl_eval_times(run: Run) -> list[tuple[float, float]]:
    """(time on the run's clock, accuracy) of every evaluation."""
    return [(ev["t"], ev["accuracy"]) for ev in run.of(kinds.EVAL) if ev.get("accuracy") is not None]


def fl_loss_curve(run: Run) -> list[tuple[int, float, float]]:
    """(round, time its update went out, mean training loss of the clients that sent one)."""
    per: dict[int, list] = defaultdict(list)
    for ev in run.of(kinds.UPLOAD_START):
        if ev.get("loss") is not None:
            per[ev["round"]].append((ev["t"], ev["loss"]))
    return [(r, max(t for t, _ in v), _mean(loss for _, loss in v)) for r, v in sorted(per.items())]


def plot_fl_accuracy(runs: list[Run]) -> Figure:
    labels, colors = run_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(15, 4.5), layout="constrained")
    left, middle, right = fig.subplots(1, 3)
    finals = [r.summary.get("final_accuracy") for r in runs]
    _bar_panel(left, labels, finals, colors, "final accuracy", "accuracy",
               lambda v: "n/a" if v is None else f"{v:.4f}", allow_log=False)
    left.set_ylim(0, 1.05)
    for run, label, color in zip(runs, labels, colors):
        curve = fl_accuracy_curve(run)
        middle.plot([r for r, _ in curve], [a for _, a in curve], marker="o", markersize=3,
                    label=label, color=color)
        timed = fl_eval_times(run)
        right.plot([t for t, _ in timed], [a for _, a in timed], marker="o", markersize=3, label=label, color=color)
    middle.set_xlabel("round")
    middle.xaxis.set_major_locator(MaxNLocator(integer=True))
    middle.set_ylabel("accuracy")
    middle.set_title("accuracy over rounds")
    middle.legend(fontsize=8)
    right.set_xlabel(_clock_label(runs))
    right.set_ylabel("accuracy")
    right.set_title("accuracy over time")
    return fig


def _clock_label(runs: list[Run]) -> str:
    clocks = {r.clock[0] for r in runs}
    return {"sim": "virtual seconds", "wall": "wall seconds"}.get(clocks.pop(), "seconds") if len(clocks) == 1 \
        else "seconds (virtual in emu, wall in real)"


def plot_fl_loss(runs: list[Run]) -> Figure:
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    for run, label, color in zip(runs, run_labels(runs), _colors(len(runs))):
        curve = fl_loss_curve(run)
        left.plot([r for r, _, _ in curve], [loss for _, _, loss in curve], marker="o", markersize=3,
                  label=label, color=color)
        right.plot([t for _, t, _ in curve], [loss for _, _, loss in curve], marker="o", markersize=3,
                   label=label, color=color)
    left.set_xlabel("round")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xlabel(_clock_label(runs))
    for ax, title in ((left, "training loss over rounds"), (right, "training loss over time")):
        ax.set_ylabel("mean loss of the clients' updates")
        ax.set_ylim(bottom=0)
        ax.set_title(title)
    left.legend(fontsize=8)
    return fig


# What happened to each client in each round, from its events and the controller's.
PARTICIPATION = ("accepted", "late", "rejected", "dropped", "offline", "absent")
_PARTICIPATION_COLORS = {"accepted": "#2ca02c", "late": "#ff7f0e", "rejected": "#d62728",
                         "dropped": "#7f7f7f", "offline": "#111111", "absent": "#f0f0f0"}


def fl_participation(run: Run) -> tuple[list[str], list[int], dict[tuple[str, int], str]]:
    """(clients, rounds, {(client, round): one of PARTICIPATION}); the first that applies wins,
    in the order accepted, late, rejected, dropped, offline (down when the round started)."""
    clients = run.client_names()
    rounds = sorted({ev["round"] for ev in run.of(kinds.ROUND_START) if "round" in ev})
    state: dict[tuple[str, int], str] = {}
    rank = {s: i for i, s in enumerate(PARTICIPATION)}

    def mark(client, round_, what):
        if client is not None and round_ is not None and rank[what] < rank[state.get((client, round_), "absent")]:
            state[(client, round_)] = what

    down: set[str] = set()
    current = None
    for ev in run.events:
        kind, node = ev.get("kind"), ev.get("node")
        if kind == kinds.ROUND_START:
            current = ev.get("round")
            for c in down:
                mark(c, current, "offline")
        elif kind == kinds.NODE_DOWN:
            down.add(node)
        elif kind == kinds.NODE_UP:
            down.discard(node)
        elif kind == kinds.UPDATE_ACCEPTED:
            mark(ev.get("client"), ev.get("round"), "accepted")
        elif kind == kinds.UPDATE_LATE:
            mark(ev.get("client"), ev.get("round"), "late")
        elif kind == kinds.UPDATE_REJECTED:
            mark(ev.get("client"), ev.get("round"), "rejected")
        elif kind == kinds.DROPOUT:
            mark(node, ev.get("round"), "dropped")
    return clients, rounds, state


def plot_fl_participation(runs: list[Run]) -> Figure:
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    fig = Figure(figsize=(11, 1.2 + 1.6 * len(runs)), layout="constrained")
    axes = fig.subplots(len(runs), 1, squeeze=False)[:, 0]
    cmap = ListedColormap([_PARTICIPATION_COLORS[s] for s in PARTICIPATION])
    for ax, run, label in zip(axes, runs, run_labels(runs)):
        clients, rounds, state = fl_participation(run)
        grid = [[PARTICIPATION.index(state.get((c, r), "absent")) for r in rounds] for c in clients]
        if rounds and clients:
            ax.imshow(grid, aspect="auto", cmap=cmap, vmin=0, vmax=len(PARTICIPATION) - 1, interpolation="none",
                      extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(clients) - 0.5, -0.5))
        ax.set_yticks(range(len(clients)), clients, fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label, fontsize=9)
    axes[-1].set_xlabel("round")
    fig.legend(handles=[Patch(color=_PARTICIPATION_COLORS[s], label=s) for s in PARTICIPATION],
               loc="outside lower center", ncols=len(PARTICIPATION), fontsize=8)
    fig.suptitle("who took part in each round")
    return fig


def fl_bytes_over_time(run: Run) -> list[tuple[float, float]]:
    """(time, bytes delivered so far): every message that reached a node, in order."""
    total, out = 0.0, []
    for ev in run.of(kinds.DELIVER):
        total += ev.get("bytes") or 0
        out.append((ev["t"], total))
    return out


def plot_fl_bytes_over_time(runs: list[Run]) -> Figure:
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    for run, label, color in zip(runs, run_labels(runs), _colors(len(runs))):
        curve = fl_bytes_over_time(run)
        ax.step([t for t, _ in curve], [b for _, b in curve], where="post", label=label, color=color)
    ax.set_xlabel(_clock_label(runs))
    ax.set_ylabel("bytes delivered so far (every node)")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(lambda v, _: human_bytes(v))
    ax.set_title("traffic over time")
    ax.legend(fontsize=8)
    return fig


FL_FIGURES: dict[str, Callable[[list[Run]], Figure]] = {
    "bytes.png": plot_fl_bytes,
    "comm_time.png": plot_fl_comm_time,
    "round_time.png": plot_fl_round_time,
    "accuracy.png": plot_fl_accuracy,
    "loss.png": plot_fl_loss,
    "participation.png": plot_fl_participation,
    "bytes_over_time.png": plot_fl_bytes_over_time,
}


def write_fl_report(runs: list[Run], out: Path) -> tuple[list[Path], str]:
    """The figures and report.md comparing the runs; returns the files and the table."""
    table = fl_markdown(fl_table(runs))
    unfinished = [r.path.name for r in runs if not r.finished]
    note = f"\nUnfinished (no summary.json; reported from their events): {', '.join(unfinished)}\n" if unfinished else ""
    return _write_report(runs, out, FL_FIGURES, table, "report.md",
                         f"# Federated learning: runs compared by {what_differs(runs)}\n\n" + table + note)
