"""Run folders in, PNG figures and a Markdown table out.

    python -m tools.report RUN_DIR [RUN_DIR ...] --out DIR

Reading a run (``load_run``) and labelling runs (``run_labels``) are shared by
every kind of report; everything named ``fl_*`` / ``plot_fl_*`` is the
federated-learning codec comparison (bytes, communication time, round time,
accuracy per codec); everything named ``ddp_*`` / ``plot_ddp_*`` is the
data-parallel comparison of the dense baseline with DGC (bytes per step,
accuracy, communication time per window, ``ddp.md``).  Each mode has an entry
in ``REPORTS``.

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas, never
through pyplot, so importing this module changes no global backend.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Callable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

MODEL_BLOB = "train/model_blob"


class ReportError(Exception):
    """A run folder that cannot be reported on (said in one line, no traceback)."""


# --- reading runs -----------------------------------------------------------


@dataclass
class Run:
    path: Path
    summary: dict
    scenario: dict
    events: list[dict] = field(repr=False)
    # Lines of events.jsonl that were not JSON (a run killed mid-write).
    bad_lines: int = 0

    @property
    def name(self) -> str:
        return self.summary.get("scenario") or self.scenario.get("name") or self.path.name

    @property
    def codec(self) -> str:
        return self.summary.get("codec") or self.scenario.get("fl", {}).get("codec") or "?"

    @property
    def runtime(self) -> str:
        return self.summary.get("runtime", "?")

    @property
    def mode(self) -> str:
        return self.summary.get("mode") or self.scenario.get("mode") or "fl"

    @property
    def clock(self) -> tuple[str, float | None]:
        """How long the run took, on its own clock: ("sim", s) in emu, ("wall", s) in real."""
        if self.runtime == "emu" and self.summary.get("time_s") is not None:
            return "sim", self.summary["time_s"]
        return "wall", self.summary.get("wall_time_s")

    def of(self, *kinds: str) -> list[dict]:
        return [ev for ev in self.events if ev.get("kind") in kinds]

    def client_names(self) -> list[str]:
        """The scenario's clients in order, then any other client the events mention."""
        n = self.scenario.get("fl", {}).get("clients") or 0
        names = [f"client{i}" for i in range(1, n + 1)]
        seen = set(names)
        for ev in self.events:
            kind = ev.get("kind")
            if kind == "update_accepted":
                who = ev.get("client")
            elif kind == "deliver" and ev.get("topic") == MODEL_BLOB:
                who = ev.get("node")
            else:
                continue
            if who is not None and who not in seen:
                seen.add(who)
                names.append(who)
        return names


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ReportError(f"{path} is not valid JSON: {err}") from None


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path}: no such run folder")
    summary_path, events_path = path / "summary.json", path / "events.jsonl"
    if not summary_path.exists():
        raise ReportError(f"{path}: no summary.json (did the run finish?)")
    if not events_path.exists():
        raise ReportError(f"{path}: no events.jsonl")
    summary = _read_json(summary_path)
    scenario = _read_json(path / "scenario.json") if (path / "scenario.json").exists() else {}
    events, bad = [], 0
    with open(events_path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
    return Run(path, summary, scenario, events, bad)


def run_labels(runs: list[Run]) -> list[str]:
    """Short, distinct names: the codec, plus whatever else tells the runs apart."""
    labels = [r.codec for r in runs]
    if len({r.name for r in runs}) > 1:
        labels = [f"{r.name} {label}" for r, label in zip(runs, labels)]
    if len({r.runtime for r in runs}) > 1:
        labels = [f"{label} ({r.runtime})" for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} [{r.path.name}]" for r, label in zip(runs, labels)]
    return labels


def _mean(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float))]
    return fmean(values) if values else None


def human_bytes(n: float | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "n/a"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} GB"


# --- federated learning: numbers ---------------------------------------------


def fl_bytes_per_update(run: Run) -> float | None:
    """Mean size of an accepted update on the wire (the whole ClientUpdate message)."""
    return _mean(ev.get("bytes") for ev in run.of("update_accepted"))


def fl_bytes_per_round(run: Run) -> float | None:
    """Client traffic, both ways, per completed round."""
    rounds = run.summary.get("rounds") or 0
    if rounds <= 0:
        return None
    return (run.summary.get("bytes_up", 0) + run.summary.get("bytes_down", 0)) / rounds


def fl_upload_comm_by_client(run: Run) -> dict[str, float]:
    """Mean seconds from a client's send to the controller's receipt, per client."""
    per: dict[str, list[float]] = defaultdict(list)
    for ev in run.of("update_accepted"):
        per[ev.get("client")].append(ev.get("comm_s"))
    return {c: m for c, v in per.items() if (m := _mean(v)) is not None}


def fl_download_comm_by_client(run: Run) -> dict[str, float]:
    """Mean seconds for the controller's model to reach each client."""
    per: dict[str, list[float]] = defaultdict(list)
    for ev in run.of("deliver"):
        if ev.get("topic") == MODEL_BLOB:
            per[ev.get("node")].append(ev.get("comm_s"))
    return {c: m for c, v in per.items() if (m := _mean(v)) is not None}


def fl_round_times(run: Run) -> list[tuple[int, int, float]]:
    """(round, attempt, seconds from round_start to round_close), in order.

    A retried round appears once per attempt: each attempt waited for its own updates.
    """
    open_: dict[int, tuple[float, int]] = {}
    times = []
    for ev in run.of("round_start", "round_close"):
        r = ev.get("round")
        if ev["kind"] == "round_start":
            open_[r] = (ev["t"], ev.get("attempt", 0))
        elif r in open_:
            start, attempt = open_.pop(r)
            times.append((r, attempt, ev["t"] - start))
    return times


def fl_accuracy_curve(run: Run) -> list[tuple[int, float]]:
    return [(ev["round"], ev["accuracy"]) for ev in run.of("eval") if ev.get("accuracy") is not None]


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
            "upload_comm_s": _mean(ev.get("comm_s") for ev in run.of("update_accepted")),
            "round_time_s": _mean(s for _, _, s in fl_round_times(run)),
            "time_s": seconds,
            "clock": clock,
        })
    return rows


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


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


# --- federated learning: figures ---------------------------------------------


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _nan(v: float | None) -> float:
    return math.nan if v is None else v


def _bar_panel(ax, labels, values, colors, title, ylabel, fmt, allow_log: bool = True) -> None:
    heights = [_nan(v) for v in values]
    bars = ax.bar(labels, heights, color=colors)
    ax.bar_label(bars, labels=[fmt(v) for v in values], padding=2, fontsize=8)
    present = [v for v in values if v]
    # Codecs differ by 10-30x: on a linear axis the small bars vanish.
    if allow_log and present and min(present) > 0 and max(present) / min(present) > 20:
        ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=20)


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


def save_figure(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120)
    return path


FL_FIGURES: dict[str, Callable[[list[Run]], Figure]] = {
    "bytes.png": plot_fl_bytes,
    "comm_time.png": plot_fl_comm_time,
    "round_time.png": plot_fl_round_time,
    "accuracy.png": plot_fl_accuracy,
}


def _write_report(runs: list[Run], out: Path, figures: dict, table: str, name: str,
                  text: str) -> tuple[list[Path], str]:
    """Save ``figures`` of ``runs`` and the Markdown ``text`` as ``name``; returns the files and the table."""
    written = [save_figure(plot(runs), out / fig) for fig, plot in figures.items()]
    (out / name).write_text(text)
    written.append(out / name)
    return written, table


def write_fl_report(runs: list[Run], out: Path) -> tuple[list[Path], str]:
    """The four codec-comparison figures and report.md; returns the files and the table."""
    table = fl_markdown(fl_table(runs))
    return _write_report(runs, out, FL_FIGURES, table, "report.md",
                         "# Federated learning: codec comparison\n\n" + table)


# --- data-parallel training: numbers -------------------------------------------
#
# A DDP run's workers emit a ``step`` event per step (bytes, DGC density,
# compute / compress / send / wait / comm seconds), a ``window`` event per
# ``ddp.window`` steps (mean and max of those), and ``eval`` per epoch.  Steps
# whose density is the run's final density are "after warm-up"; a dense run
# (density 1 throughout) has no warm-up.


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
    return run.of("step")


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
    for ev in run.of("eval"):
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
    for ev in run.of("window"):
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


# --- data-parallel training: figures -------------------------------------------


def _line_styles(n: int) -> list:
    return [("-", "--", "-.", ":")[i % 4] for i in range(n)]


def _log_if_wide(ax, values) -> None:
    present = [v for v in values if v and v > 0]
    if present and max(present) / min(present) > 20:
        ax.set_yscale("log")


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


# One report per mode.
REPORTS: dict[str, Callable[[list[Run], Path], tuple[list[Path], str]]] = {
    "fl": write_fl_report,
    "ddp": write_ddp_report,
}


# --- command line -------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.report", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (events.jsonl, summary.json, ...)")
    parser.add_argument("--out", default="report", help="folder for the figures and report.md / ddp.md (default: report)")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(p) for p in args.runs]
    except ReportError as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    by_mode: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_mode[run.mode].append(run)
    unknown = sorted(set(by_mode) - set(REPORTS))
    if unknown:
        print(f"report: no report for mode {', '.join(unknown)} yet (known: {', '.join(REPORTS)})",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for mode, group in by_mode.items():
        for run in group:
            if run.bad_lines:
                print(f"report: {run.path}: skipped {run.bad_lines} unreadable event lines", file=sys.stderr)
        written, table = REPORTS[mode](group, out)
        print(table)
        for path in written:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
