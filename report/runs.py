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

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dtemu.core.wire.topics import MODEL_BLOB
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
    present = [v for v in values if v]
    # Codecs differ by 10-30x: on a linear axis the small bars vanish.
    if allow_log and present and min(present) > 0 and max(present) / min(present) > 20:
        ax.set_yscale("log")
    ax.margins(y=0.15)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=20)


def save_figure(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120)
    return path


def _write_report(runs: list[Run], out: Path, figures: dict, table: str, name: str,
                  text: str) -> tuple[list[Path], str]:
    """Save ``figures`` of ``runs`` and the Markdown ``text`` as ``name``; returns the files and the table."""
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
