"""The geo report (``mode: geo``, issue 11): runs across data centres side by side.

What a reader of a GeoMX-style comparison asks, per run: how many bytes each WAN node sent up and
received down per round (a WAN node is a local PS under HiPS, a worker under the flat PS), when
each target accuracy was first reached, and how accuracy grew over time.  All of it is read from
the run folder: ``summary.json`` (``wan``, ``time_to_accuracy``, ``wan_bytes``) and the events
(the master's ``eval``, the PSs' ``geo_round``, the workers' ``geo_step``, every role's
``geo_end``), so a run killed half way is reported as far as it got.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Callable

from matplotlib.figure import Figure

from dtemu.core import events as kinds
from dtemu.core.geo.spec import MASTER
from dtemu.report.runs import Run, _flat, differing_keys, _colors, _fmt, _line_styles, _write_report, human_bytes, \
    mark_missing, plot_time_to_accuracy, time_to_accuracy, tta_text


def geo_spec(run: Run) -> dict:
    return run.scenario.get("geo") or {}


def geo_architecture(run: Run) -> str:
    return run.summary.get("architecture") or geo_spec(run).get("architecture") or "?"


def geo_compression(run: Run) -> str:
    return run.summary.get("compression") or geo_spec(run).get("compression") or "?"


def geo_wan_mbps(run: Run) -> str:
    """The sites' WAN attachments, e.g. "155" (all alike, up = down) or "155/50" (up/down)."""
    sites = (run.scenario.get("network") or {}).get("sites") or {}
    speeds = {((s.get("wan") or {}).get("up_mbps"), (s.get("wan") or {}).get("down_mbps")) for s in sites.values()}
    if len(speeds) != 1:
        return "mixed" if speeds else "?"
    up, down = speeds.pop()
    return f"{up:g}" if up == down and up is not None else f"{up}/{down}"


def geo_labels(runs: list[Run]) -> list[str]:
    """"hips bisparse_fp16", plus the WAN speed, the sync mode or the runtime where the runs differ."""
    labels = [f"{geo_architecture(r)} {geo_compression(r)}" for r in runs]
    for part in (lambda r: f"{geo_wan_mbps(r)} Mbit/s", lambda r: geo_spec(r).get("sync") or "fsa",
                 lambda r: f"({r.runtime})"):
        if len({part(r) for r in runs}) > 1:
            labels = [f"{label} {part(r)}" for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):   # then the other geo keys that differ (geo.dense_below=1024)
        keys = [k for k in differing_keys(runs) if k.startswith("geo.") and k not in ("geo.architecture",
                                                                                     "geo.compression", "geo.sync")]
        if keys:
            labels = [label + "".join(f" {k[4:]}={_flat(r.scenario).get(k)}" for k in keys[:2])
                      for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} [{r.path.name}]" for r, label in zip(runs, labels)]
    return [label + ("" if r.finished else " (unfinished)") for r, label in zip(runs, labels)]


def geo_wan_role(run: Run) -> str:
    """The role whose node crosses the WAN every round."""
    return "local_ps" if geo_architecture(run) == "hips" else "worker"


def geo_accuracy_curve(run: Run) -> list[tuple[float, int | None, float]]:
    """(time, round, accuracy) of the master's evaluations, in order."""
    return [(ev.get("t", 0.0), ev.get("round"), ev["accuracy"]) for ev in run.of(kinds.EVAL)
            if ev.get("node", MASTER) == MASTER and ev.get("accuracy") is not None]


def geo_time_to_accuracy(run: Run) -> dict[str, float | None]:
    """The summary's map, else (unfinished run) the first evaluation at or above each target."""
    return time_to_accuracy(run, [(t, a) for t, _, a in geo_accuracy_curve(run)])


def geo_wan_curve(run: Run) -> list[tuple[int, float, float]]:
    """(round, mean bytes up, mean bytes down) per WAN node: the local PSs' ``geo_round`` under
    HiPS; under the flat PS the workers' pushes and what the PS sent each of them."""
    up: dict[int, list] = defaultdict(list)
    down: dict[int, list] = defaultdict(list)
    if geo_architecture(run) == "hips":
        for ev in run.of(kinds.GEO_ROUND):
            if ev.get("role") == "local_ps" and ev.get("round") is not None:
                up[ev["round"]].append(ev.get("bytes_up", 0))
                down[ev["round"]].append(ev.get("bytes_down", 0))
    else:
        for ev in run.of(kinds.GEO_STEP):
            if ev.get("round") is not None:
                up[ev["round"]].append(ev.get("bytes_sent", 0))
        for ev in run.of(kinds.GEO_ROUND):
            if ev.get("role") == "flat_ps" and ev.get("round") is not None:
                down[ev["round"]].append(ev.get("bytes_down", 0))
    rounds = sorted(set(up) | set(down))
    return [(r, fmean(up[r]) if up[r] else 0.0, fmean(down[r]) if down[r] else 0.0) for r in rounds]


def geo_nodes(run: Run) -> list[dict]:
    """Per WAN node (from ``geo_end``): rounds, bytes it sent and received across the WAN per round."""
    rows = []
    for ev in run.of(kinds.GEO_END):
        if ev.get("role") != geo_wan_role(run):
            continue
        rounds = ev.get("rounds") or 0
        rows.append({"node": ev.get("node"), "rounds": rounds,
                     "up": ev.get("wan_sent", 0) / rounds if rounds else None,
                     "down": ev.get("wan_received", 0) / rounds if rounds else None,
                     "rejected": ev.get("rejected", 0)})
    return sorted(rows, key=lambda row: str(row["node"]))


def _wan_means(run: Run) -> tuple[float | None, float | None, float | None, float | None]:
    """(up, down, up ratio, down ratio) per WAN node and round: the summary's, else the events'."""
    wan = run.summary.get("wan") or {}
    if wan.get("up_per_node_round") is not None:
        return wan["up_per_node_round"], wan["down_per_node_round"], wan.get("up_ratio"), wan.get("down_ratio")
    curve = geo_wan_curve(run)
    if not curve:
        return None, None, None, None
    return fmean(u for _, u, _ in curve), fmean(d for _, _, d in curve), None, None


def geo_table(runs: list[Run]) -> list[dict]:
    rows = []
    for run, label in zip(runs, geo_labels(runs)):
        up, down, up_ratio, down_ratio = _wan_means(run)
        curve = geo_accuracy_curve(run)
        rounds = run.summary.get("rounds") or max((r for r, *_ in geo_wan_curve(run)), default=None)
        clock, seconds = run.clock
        rows.append({
            "label": label, "runtime": run.runtime, "architecture": geo_architecture(run),
            "compression": geo_compression(run), "sync": geo_spec(run).get("sync") or run.summary.get("sync"),
            "wan_mbps": geo_wan_mbps(run), "rounds": rounds,
            "final_accuracy": run.summary.get("final_accuracy", curve[-1][2] if curve else None),
            "time_to_accuracy": geo_time_to_accuracy(run),
            "s_per_round": seconds / rounds if seconds is not None and rounds else None,
            "wan_up": up, "wan_down": down, "up_ratio": up_ratio, "down_ratio": down_ratio,
            "wan_bytes": run.summary.get("wan_bytes"), "models_agree": run.summary.get("models_agree"),
            "lost": run.summary.get("lost") or [], "time_s": seconds, "clock": clock,
        })
    return rows


def geo_markdown(rows: list[dict]) -> str:
    header = ("| run | runtime | WAN Mbit/s | rounds | final accuracy | time to accuracy (s) | s per round "
              "| WAN up / down per node and round | vs dense fp32 | WAN bytes in all | models agree | lost "
              "| run time (s) |")
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        ratio = "n/a" if row["up_ratio"] is None else f"{row['up_ratio']:.4f} / {row['down_ratio']:.4f}"
        lines.append("| " + " | ".join([
            row["label"], row["runtime"], row["wan_mbps"], _fmt(row["rounds"], "d"),
            _fmt(row["final_accuracy"], ".4f"), tta_text(row["time_to_accuracy"]), _fmt(row["s_per_round"], ".3f"),
            f"{human_bytes(row['wan_up'])} / {human_bytes(row['wan_down'])}", ratio, human_bytes(row["wan_bytes"]),
            {True: "yes", False: "no", None: "n/a"}[row["models_agree"]], ", ".join(row["lost"]) or "–",
            "n/a" if row["time_s"] is None else f"{row['time_s']:.2f} ({row['clock']})",
        ]) + " |")
    return "\n".join(lines) + "\n"


def geo_nodes_markdown(runs: list[Run]) -> str:
    lines = ["| run | WAN node | rounds | bytes up per round | bytes down per round | refused |", "|---" * 6 + "|"]
    for run, label in zip(runs, geo_labels(runs)):
        for row in geo_nodes(run):
            lines.append(f"| {label} | {row['node']} | {row['rounds']} | {_fmt(row['up'], ',.0f')} "
                         f"| {_fmt(row['down'], ',.0f')} | {row['rejected']} |")
    return "\n".join(lines) + "\n"


GEO_NOTES = """
A WAN node is a local parameter server under HiPS (it pushes its site's gradient to the global
PS and pulls the aggregate) and a worker under the flat PS.  "Per node and round" averages over
the WAN nodes and the rounds, the initial model excluded; "vs dense fp32" divides by the model's
size at 4 bytes a parameter.  "WAN bytes in all" is every byte that crossed a WAN link, both
directions, the initial model included.  Time is the run's own clock (virtual in emu).  Time to
accuracy is the first evaluation of the master at or above each target (`targets` in the
scenario), so it is as coarse as `geo.eval_every`.
"""


def plot_geo_accuracy(runs: list[Run]) -> Figure:
    labels, colors = geo_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    targets = sorted({float(t) for r in runs for t in geo_time_to_accuracy(r)})
    for run, label, color, style in zip(runs, labels, colors, _line_styles(len(runs))):
        curve = geo_accuracy_curve(run)
        left.plot([t for t, _, _ in curve], [a for _, _, a in curve], marker="o", markersize=3, label=label,
                  color=color, linestyle=style)
        right.plot([r for _, r, _ in curve], [a for _, _, a in curve], marker="o", markersize=3, label=label,
                   color=color, linestyle=style)
    for ax, xlabel in ((left, f"time ({runs[0].clock[0] if runs else 'sim'}, s)"), (right, "round")):
        for t in targets:
            ax.axhline(t, color="0.6", linestyle=":", linewidth=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (master)")
        ax.grid(True, alpha=0.3)
    left.set_title("accuracy over time (dotted: targets)")
    right.set_title("accuracy per round")
    if runs:
        left.legend(fontsize=8)
    return fig


def plot_geo_wan(runs: list[Run]) -> Figure:
    labels, colors = geo_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(13, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    for run, label, color in zip(runs, labels, colors):
        curve = geo_wan_curve(run)
        left.plot([r for r, _, _ in curve], [u for _, u, _ in curve], color=color, linewidth=1.2, label=label)
        left.plot([r for r, _, _ in curve], [d for _, _, d in curve], color=color, linewidth=1.2, linestyle="--")
    if any(geo_wan_curve(r) for r in runs):
        left.set_yscale("log")
    left.set_xlabel("round")
    left.set_ylabel("bytes per WAN node")
    left.set_title("WAN bytes per node and round: up (solid), down (dashed)")
    left.grid(True, which="major", alpha=0.3)
    if runs:
        left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2)
    means = [_wan_means(r) for r in runs]
    xs = list(range(len(runs)))
    width = 0.38
    for offset, which, name, hatch in ((-width / 2, 0, "up", ""), (width / 2, 1, "down", "//")):
        values = [m[which] for m in means]
        bars = right.bar([x + offset for x in xs], [v if v is not None else float("nan") for v in values], width,
                         color=colors, hatch=hatch, edgecolor="0.3", label=name)
        right.bar_label(bars, labels=[human_bytes(v) for v in values], padding=2, fontsize=7, rotation=90)
        mark_missing(right, [x + offset for x in xs], values)
    present = [v for m in means for v in m[:2] if v]
    if present and max(present) / min(present) > 20:
        right.set_yscale("log")
    right.set_xticks(xs, labels, rotation=20, ha="right", fontsize=8)
    right.set_ylabel("bytes per WAN node and round")
    right.set_title("mean per node and round (hatched: down)")
    right.margins(y=0.2)
    return fig


def plot_geo_time_to_accuracy(runs: list[Run]) -> Figure:
    return plot_time_to_accuracy(runs, geo_labels(runs), geo_time_to_accuracy, ".1f")


GEO_FIGURES: dict[str, Callable[[list[Run]], Figure]] = {
    "geo_accuracy.png": plot_geo_accuracy,
    "geo_wan.png": plot_geo_wan,
    "geo_time_to_accuracy.png": plot_geo_time_to_accuracy,
}


def write_geo_report(runs: list[Run], out: Path) -> tuple[list[Path], str]:
    """The three geo figures and geo.md; returns the files and the table."""
    table = geo_markdown(geo_table(runs))
    text = ("# Training across data centres (geo)\n\n" + table + "\n## Per WAN node\n\n" + geo_nodes_markdown(runs)
            + GEO_NOTES)
    return _write_report(runs, out, GEO_FIGURES, table, "geo.md", text)
