"""The data-parallel report: the dense baseline against DGC (bytes per step, accuracy, communication time).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable
from statistics import fmean

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dtemu.core import events as kinds
from dtemu.report.runs import (_bar_panel, Run, _colors, _fmt, _line_styles, _log_if_wide, _mean, _write_report,
                               human_bytes)


def _network_variant(run: Run, fields: set[str]) -> str:
    """The scenario's default link, e.g. "100Mb" or "1Gb 5ms", naming only ``fields``."""
    net = run.scenario.get("network") or {}
    link = net.get("default") or {}
    parts = []
    if "speed" in fields:
        up, down = link.get("up_mbps"), link.get("down_mbps")

        def speed(mbps):
            if mbps is None:
                return "?"
            return f"{mbps / 1000:g}Gb" if mbps >= 1000 else f"{mbps:g}Mb"

        parts.append(speed(up) if up == down else f"{speed(up)}/{speed(down)}")
    if "latency" in fields:
        latency = link.get("latency_ms")
        parts.append("?ms" if latency is None else f"{latency:g}ms")
    if "loss" in fields:
        parts.append(f"loss {link.get('loss', 0):g}")
    if "other" in fields:
        parts.append("+".join(sorted(net.get("nodes") or {})) or "default")
    return " ".join(parts)


def ddp_compression(run: Run) -> str:
    return run.summary.get("compression") or run.scenario.get("ddp", {}).get("compression") or "?"


def ddp_labels(runs: list[Run]) -> list[str]:
    """The compression, plus the network variant when the runs' networks differ ("dgc 100Mb")."""
    labels = [ddp_compression(r) for r in runs]
    nets = [r.scenario.get("network") or {} for r in runs]
    if any(n != nets[0] for n in nets):
        links = [n.get("default") or {} for n in nets]

        def differs(*keys):
            return len({tuple(link.get(k) for k in keys) for link in links}) > 1

        fields = {name for name, keys in (("speed", ("up_mbps", "down_mbps")), ("latency", ("latency_ms",)),
                                          ("loss", ("loss",))) if differs(*keys)}
        if not fields:  # per-node overrides or the mtu differ
            fields = {"other"} if len({json.dumps(n.get("nodes"), sort_keys=True) for n in nets}) > 1 else set()
        if fields:
            labels = [f"{label} {_network_variant(r, fields)}" for r, label in zip(runs, labels)]
    if len({r.runtime for r in runs}) > 1:
        labels = [f"{label} ({r.runtime})" for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels) and len({_workers(r) for r in runs}) > 1:
        labels = [f"{label} W={_workers(r)}" for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} [{r.path.name}]" for r, label in zip(runs, labels)]
    return labels


def _workers(run: Run):
    return run.summary.get("workers") or run.scenario.get("ddp", {}).get("workers")


def ddp_steps(run: Run) -> list[dict]:
    return run.of(kinds.STEP)


def ddp_final_density(run: Run) -> float | None:
    """The density of the run's last step (1.0 for a dense run)."""
    steps = [ev for ev in ddp_steps(run) if ev.get("density") is not None]
    if not steps:
        return None
    return max(steps, key=lambda ev: (ev.get("step", -1), ev.get("t", 0))).get("density")


def ddp_split_steps(run: Run) -> tuple[list[dict], list[dict]]:
    """(warm-up, after warm-up) step events: after = density equals the final density."""
    final = ddp_final_density(run)
    warm, after = [], []
    for ev in ddp_steps(run):
        (after if final is None or ev.get("density") == final else warm).append(ev)
    return warm, after


def ddp_bytes_per_step(run: Run) -> tuple[float | None, float | None]:
    """Mean bytes one worker sent per step, (during warm-up, after warm-up).

    Without step events, the summary's ``bytes_per_step`` stands for after.
    """
    warm, after = ddp_split_steps(run)
    if not warm and not after:
        return None, run.summary.get("bytes_per_step")
    return (_mean(ev.get("bytes_sent") for ev in warm),
            _mean(ev.get("bytes_sent") for ev in after))


def ddp_bytes_curve(run: Run) -> list[tuple[int, float]]:
    """(step, mean bytes sent per worker) for every step."""
    per: dict[int, list] = defaultdict(list)
    for ev in ddp_steps(run):
        if ev.get("step") is not None:
            per[ev["step"]].append(ev.get("bytes_sent"))
    return [(s, m) for s in sorted(per) if (m := _mean(per[s])) is not None]


def ddp_warmup_end(run: Run) -> int | None:
    """The first step at the final density, if there was a warm-up before it."""
    warm, after = ddp_split_steps(run)
    if not warm or not after:
        return None
    return min(ev.get("step", 0) for ev in after)


def ddp_total_bytes(run: Run) -> float | None:
    """Everything the workers sent over the run (summary ``bytes_up``, else the step events)."""
    if run.summary.get("bytes_up") is not None:
        return run.summary["bytes_up"]
    steps = ddp_steps(run)
    return sum(ev.get("bytes_sent", 0) for ev in steps) if steps else None


def ddp_accuracy_curve(run: Run) -> list[tuple[int, float]]:
    """(epoch, test accuracy); every worker reports the same number, they are averaged."""
    per: dict[int, list] = defaultdict(list)
    for ev in run.of(kinds.EVAL):
        if ev.get("accuracy") is not None and ev.get("epoch") is not None:
            per[ev["epoch"]].append(ev["accuracy"])
    return [(e, fmean(per[e])) for e in sorted(per)]


def ddp_final_accuracy(run: Run) -> float | None:
    if run.summary.get("final_accuracy") is not None:
        return run.summary["final_accuracy"]
    curve = ddp_accuracy_curve(run)
    return curve[-1][1] if curve else None


@dataclass
class Window:
    first_step: int
    steps: int
    mean: float  # over the window's steps and the workers
    max: float  # the slowest worker's slowest step


def ddp_comm_windows(run: Run, key: str = "comm_s") -> list[Window]:
    """Per profiling window, the mean and max of ``key`` over the workers.

    From ``window`` events; a run without them gets one window per step.
    """
    per: dict[int, list[dict]] = defaultdict(list)
    for ev in run.of(kinds.WINDOW):
        if ev.get("first_step") is not None and ev.get(f"{key}_mean") is not None:
            per[ev["first_step"]].append(ev)
    if per:
        out = []
        for first in sorted(per):
            evs = per[first]
            weights = [ev.get("steps", 1) or 1 for ev in evs]
            mean = sum(ev[f"{key}_mean"] * w for ev, w in zip(evs, weights)) / sum(weights)
            out.append(Window(first, max(weights), mean, max(ev.get(f"{key}_max", ev[f"{key}_mean"]) for ev in evs)))
        return out
    by_step: dict[int, list] = defaultdict(list)
    for ev in ddp_steps(run):
        if ev.get("step") is not None and ev.get(key) is not None:
            by_step[ev["step"]].append(ev[key])
    return [Window(s, 1, fmean(v), max(v)) for s, v in sorted(by_step.items())]


def _dense_reference(run: Run, runs: list[Run], after: dict[int, float | None]) -> Run | None:
    """The dense run to compare ``run`` with: the same network, runtime and workers, then
    fewer of those, else the only dense run there is."""
    dense = [r for r in runs if ddp_compression(r) == "none" and after[id(r)]]
    keys = (lambda r: (r.scenario.get("network"), r.runtime, _workers(r)),
            lambda r: (r.scenario.get("network"), _workers(r)),
            lambda r: r.scenario.get("network"),
            lambda r: _workers(r))
    for key in keys:
        matches = [r for r in dense if key(r) == key(run)]
        if matches:
            return matches[0]
    return dense[0] if len(dense) == 1 else None


def ddp_table(runs: list[Run]) -> list[dict]:
    """One row per run; ``vs_dense`` is bytes per step after warm-up over the dense run's."""
    per = {id(r): ddp_bytes_per_step(r) for r in runs}
    after = {k: v[1] for k, v in per.items()}
    rows = []
    for run, label in zip(runs, ddp_labels(runs)):
        ref = _dense_reference(run, runs, after)
        warm_bytes, after_bytes = per[id(run)]
        _, after_steps = ddp_split_steps(run)
        comm = [ev.get("comm_s") for ev in after_steps]
        comm = [c for c in comm if isinstance(c, (int, float))]
        clock, seconds = run.clock
        rows.append({
            "label": label,
            "runtime": run.runtime,
            "compression": ddp_compression(run),
            "workers": _workers(run),
            "steps": run.summary.get("steps"),
            "final_accuracy": ddp_final_accuracy(run),
            "final_density": ddp_final_density(run),
            "warmup_steps": ddp_warmup_end(run),
            "bytes_per_step_warmup": warm_bytes,
            "bytes_per_step_after": after_bytes,
            "vs_dense": after_bytes / after[id(ref)] if ref is not None and after_bytes is not None else None,
            "comm_s_mean": fmean(comm) if comm else None,
            "comm_s_max": max(comm) if comm else None,
            "compress_s_mean": _mean(ev.get("compress_s") for ev in after_steps),
            "total_bytes": ddp_total_bytes(run),
            "models_agree": run.summary.get("models_agree"),
            "time_s": seconds,
            "clock": clock,
        })
    return rows


def ddp_markdown(rows: list[dict]) -> str:
    header = ("| run | runtime | workers | steps | final accuracy | bytes/step warm-up "
              "| bytes/step after warm-up | vs dense | comm mean (s) | comm max (s) "
              "| compress mean (s) | run time (s) |")
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for row in rows:
        time_s = "n/a" if row["time_s"] is None else f"{row['time_s']:.3f} ({row['clock']})"
        warm = "–" if row["bytes_per_step_warmup"] is None else format(row["bytes_per_step_warmup"], ",.0f")
        lines.append("| " + " | ".join([
            row["label"],
            row["runtime"],
            _fmt(row["workers"], "d"),
            _fmt(row["steps"], "d"),
            _fmt(row["final_accuracy"], ".4f"),
            warm,
            _fmt(row["bytes_per_step_after"], ",.0f"),
            _fmt(row["vs_dense"], ".4f"),
            _fmt(row["comm_s_mean"], ".4f"),
            _fmt(row["comm_s_max"], ".4f"),
            _fmt(row["compress_s_mean"], ".4f"),
            time_s,
        ]) + " |")
    return "\n".join(lines) + "\n"


DDP_NOTES = """
Bytes per step: what one worker sent in one step, averaged over workers and
steps.  Warm-up: the steps before the run's final density (DGC's 25%, 6.25%,
1.5625%, 0.4% stages); a dense run has none ("–") and all its steps count as
after.  "vs dense": bytes per step after warm-up over the dense baseline's
(same network where there is one).  Comm and compress times are per worker
per step, after warm-up; comm = send + wait for every rank's payload.
"""


def plot_ddp_bytes(runs: list[Run]) -> Figure:
    labels, colors = ddp_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[2, 1])
    # Runs with the same schedule send the same bytes: line styles keep them visible.
    for run, label, color, style in zip(runs, labels, colors, _line_styles(len(runs))):
        curve = ddp_bytes_curve(run)
        left.plot([s for s, _ in curve], [b for _, b in curve], label=label, color=color, linewidth=1.4,
                  linestyle=style)
        end = ddp_warmup_end(run)
        if end is not None:
            left.axvline(end, color=color, linestyle=":", linewidth=1)
    left.set_yscale("log")
    left.set_xlabel("step")
    left.set_ylabel("bytes sent per worker per step")
    left.set_title("bytes per step (dotted: end of warm-up)")
    left.grid(True, which="major", alpha=0.3)
    if runs:
        left.legend(fontsize=8)
    _bar_panel(right, labels, [ddp_total_bytes(r) for r in runs], colors,
               "total bytes sent (all workers)", "bytes", human_bytes)
    fig.suptitle("communication volume: dense baseline vs DGC")
    return fig


def plot_ddp_accuracy(runs: list[Run]) -> Figure:
    labels, colors = ddp_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    for run, label, color, style in zip(runs, labels, colors, _line_styles(len(runs))):
        curve = ddp_accuracy_curve(run)
        left.plot([e + 1 for e, _ in curve], [a for _, a in curve], marker="o", markersize=3,
                  label=label, color=color, linestyle=style)
    left.set_xlabel("epochs trained")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_ylabel("test accuracy")
    left.set_title("test accuracy per epoch")
    if runs:
        left.legend(fontsize=8)
    _bar_panel(right, labels, [ddp_final_accuracy(r) for r in runs], colors, "final accuracy", "accuracy",
               lambda v: "n/a" if v is None else f"{v:.4f}", allow_log=False)
    right.set_ylim(0, 1.05)
    return fig


def plot_ddp_comm_time(runs: list[Run]) -> Figure:
    labels, colors = ddp_labels(runs), _colors(len(runs))
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    ax = fig.subplots()
    values = []
    for run, label, color in zip(runs, labels, colors):
        windows = ddp_comm_windows(run)
        xs = [w.first_step + (w.steps - 1) / 2 for w in windows]
        ax.plot(xs, [w.mean for w in windows], color=color, marker="o", markersize=3, label=f"{label} mean")
        ax.plot(xs, [w.max for w in windows], color=color, linestyle="--", marker="^", markersize=3,
                label=f"{label} max")
        values += [w.mean for w in windows] + [w.max for w in windows]
        end = ddp_warmup_end(run)
        if end is not None:
            ax.axvline(end, color=color, linestyle=":", linewidth=1)
    _log_if_wide(ax, values)
    ax.set_xlabel("step (middle of each profiling window)")
    ax.set_ylabel("communication time per step (s)")
    ax.set_title("communication time per step, per window: mean (solid) and max (dashed) over workers")
    ax.grid(True, which="major", alpha=0.3)
    if runs:
        ax.legend(fontsize=8, ncols=2)
    return fig


DDP_FIGURES: dict[str, Callable[[list[Run]], Figure]] = {
    "ddp_bytes.png": plot_ddp_bytes,
    "ddp_accuracy.png": plot_ddp_accuracy,
    "ddp_comm_time.png": plot_ddp_comm_time,
}


def write_ddp_report(runs: list[Run], out: Path) -> tuple[list[Path], str]:
    """The three baseline-vs-DGC figures and ddp.md; returns the files and the table."""
    table = ddp_markdown(ddp_table(runs))
    return _write_report(runs, out, DDP_FIGURES, table, "ddp.md",
                         "# Data-parallel training: dense baseline vs DGC\n\n" + table + DDP_NOTES)
