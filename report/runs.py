"""Reading run folders for reports: ``Run``, ``load_run``, labels, and the helpers every figure uses.

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas, never
through pyplot, so importing this package changes no global backend.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Callable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dtemu.core.wire.topics import MODEL_BLOB
from dtemu.host.rundir import read_events_partial
from dtemu.core import events as kinds


class ReportError(Exception):
    """A run folder that cannot be reported on (said in one line, no traceback)."""


@dataclass
class Run:
    path: Path
    summary: dict
    scenario: dict
    events: list[dict] = field(repr=False)
    # Lines of events.jsonl that were not JSON (a run killed mid-write).
    bad_lines: int = 0
    # False: no summary.json (killed, or still going); reported from its events as far as it got.
    finished: bool = True

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
            if kind == kinds.UPDATE_ACCEPTED:
                who = ev.get("client")
            elif kind == kinds.DELIVER and ev.get("topic") == MODEL_BLOB:
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
    """A run folder, finished or not (a killed run has events and no summary: reported as far as it got)."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path}: no such run folder")
    events, bad = read_events_partial(path)
    finished = (path / "summary.json").exists()
    if not events and not finished:
        raise ReportError(f"{path}: no events.jsonl and no summary.json: not a run folder")
    summary = _read_json(path / "summary.json") if finished else {}
    scenario = {}
    for where in (path / "scenario.json", path / "rank0" / "scenario.json"):
        if where.exists():
            scenario = _read_json(where)
            break
    return Run(path, summary, scenario, events, bad, finished)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v
    return out


# Keys that differ between runs without telling them apart in a way a reader cares about.
_NOT_LABELS = {"name", "fl.init_path", "data.root"}


def differing_keys(runs: list[Run]) -> list[str]:
    """The scenario keys whose values differ between the runs (what a comparison is about)."""
    flats = [_flat(r.scenario) for r in runs]
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if k not in _NOT_LABELS and len({repr(f.get(k)) for f in flats}) > 1]


def run_labels(runs: list[Run]) -> list[str]:
    """Short, distinct names: the codec, plus whatever else tells the runs apart (the scenario,
    the runtime, else the scenario keys that differ, else the folder)."""
    labels = [r.codec for r in runs]
    if len({r.name for r in runs}) > 1:
        labels = [f"{r.name} {label}" for r, label in zip(runs, labels)]
    if len({r.runtime for r in runs}) > 1:
        labels = [f"{label} ({r.runtime})" for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):
        keys = [k for k in differing_keys(runs) if k != "fl.codec"][:2]
        if keys:
            labels = [f"{label} " + ", ".join(f"{k.split('.')[-1]}={_flat(r.scenario).get(k)}" for k in keys)
                      for r, label in zip(runs, labels)]
    if len(set(labels)) < len(labels):
        labels = [f"{label} [{r.path.name}]" for r, label in zip(runs, labels)]
    return [label + ("" if r.finished else " (unfinished)") for r, label in zip(runs, labels)]


def what_differs(runs: list[Run]) -> str:
    """A title's words for what the runs differ in ("codec", "runtime", "up_mbps", ...)."""
    if len({r.name for r in runs}) > 1:
        parts = ["scenario"]  # different scenarios differ in everything; say so
    else:
        parts = list(dict.fromkeys(k.split(".")[-1] for k in differing_keys(runs)))[:3]
    if len({r.runtime for r in runs}) > 1:
        parts.append("runtime")
    return ", ".join(parts) if parts else "run"


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


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


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
    mark_missing(ax, range(len(values)), values)
    present = [v for v in values if v]
    # Codecs differ by 10-30x: on a linear axis the small bars vanish.
    if allow_log and present and min(present) > 0 and max(present) / min(present) > 20:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)  # a bar's height is only read right from zero
    ax.margins(y=0.15)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=20)


def mark_missing(ax, xs, values) -> None:
    """Write "n/a" where a value is missing, so that no bar reads as a zero."""
    for x, v in zip(xs, values):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            ax.annotate("n/a", (x, 0), xycoords=("data", "axes fraction"), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=7, color="0.4", rotation=90)


def save_figure(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120)
    return path


def _write_report(runs: list[Run], out: Path, figures: dict, table: str, name: str,
                  text: str) -> tuple[list[Path], str]:
    """Save ``figures`` of ``runs`` and the Markdown ``text`` as ``name``; returns the files and the table."""
    out.mkdir(parents=True, exist_ok=True)
    written = [save_figure(plot(runs), out / fig) for fig, plot in figures.items()]
    (out / name).write_text(text)
    written.append(out / name)
    return written, table


def _line_styles(n: int) -> list:
    return [("-", "--", "-.", ":")[i % 4] for i in range(n)]


def _log_if_wide(ax, values) -> None:
    present = [v for v in values if v and v > 0]
    if present and max(present) / min(present) > 20:
        ax.set_yscale("log")


def time_to_accuracy(run: Run, curve: list[tuple[float, float]]) -> dict[str, float | None]:
    """The summary's ``time_to_accuracy``, else (a run cut short) the first of ``curve``'s
    (time, accuracy) evaluations at or above each of the scenario's targets."""
    if run.summary.get("time_to_accuracy"):
        return dict(run.summary["time_to_accuracy"])
    out = {}
    for target in run.scenario.get("targets") or []:
        hit = [t for t, a in curve if a >= target]
        out[str(target)] = hit[0] if hit else None
    return out


def tta_text(tta: dict) -> str:
    return ", ".join(f"{k}: {'n/a' if v is None else f'{v:.2f}'}" for k, v in tta.items()) or "n/a"


def plot_time_to_accuracy(runs: list[Run], labels: list[str], tta: Callable[[Run], dict], fmt: str) -> Figure:
    """One bar panel per target accuracy: each run's time to it (n/a: not reached)."""
    colors = _colors(len(runs))
    maps = [tta(r) for r in runs]
    targets = list(dict.fromkeys(k for m in maps for k in m))
    fig = Figure(figsize=(4 + 3 * max(len(targets), 1), 4.5), layout="constrained")
    axes = fig.subplots(1, max(len(targets), 1), squeeze=False)[0]
    for ax, target in zip(axes, targets or [None]):
        values = [m.get(target) if target else None for m in maps]
        _bar_panel(ax, labels, values, colors, f"time to accuracy {target}" if target else "no targets",
                   "time (s)", lambda v: "n/a" if v is None else format(v, fmt))
    fig.suptitle("time to each target accuracy (n/a: not reached)")
    return fig
