"""The dashboard's state (host.dashboard_state) as one rich renderable: a header, a row per node
(or a summary by state when there are many), the recent events."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dtemu.host.dashboard_state import (AGGREGATING, COLLECTING, MAX_ROWS, STATE_STYLES, TRAINING, UPLOADING,
                                        DashboardState, NodeView)


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _short(value: Any, width: int = 40) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, (list, tuple)) and len(value) > 4:
        text = f"[{len(value)} items]"
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def event_line(ev: dict) -> str:
    """One event as one line: time, node, kind, then its fields."""
    fields = " ".join(f"{k}={_short(v)}" for k, v in ev.items() if k not in ("t", "node", "kind"))
    t = ev.get("t")
    stamp = f"{t:10.3f}" if isinstance(t, (int, float)) else f"{'?':>10}"
    return f"{stamp}  {_short(ev.get('node', '?'), 12):<12} {ev.get('kind', '?')}  {fields}"


def _header(state: DashboardState, title: str, elapsed_s: float | None) -> Panel:
    total = state.rounds_total if state.rounds_total is not None else "?"
    round_ = state.round if state.round is not None else "-"
    parts = [f"{state.unit} {round_}/{total}"]
    if state.attempt:
        parts.append(f"attempt {state.attempt}")
    if state.sampled is not None:
        parts.append(f"asked {state.sampled[0]} of {state.sampled[1]} available")
    parts.append(f"t {state.t:.3f} s")
    if elapsed_s is not None:
        parts.append(f"wall {elapsed_s:.1f} s")
    acc = "-" if state.accuracy is None else f"{state.accuracy:.4f} (round {state.accuracy_round})"
    parts.append(f"accuracy {acc}")
    counts = (f"failed rounds {state.rounds_failed}   updates accepted {state.accepted}"
              f" / late {state.late} / rejected {state.rejected}")
    body = Text("   ".join(parts) + "\n" + counts)
    if state.end_reason is not None:
        body.append(f"\nfinished: {state.end_reason}", style="bold green")
    for why in state.testbed_why:
        body.append(f"\ntestbed NOT faithful: {why}", style="bold red")
    if state.bad_events:
        body.append(f"\n{state.bad_events} malformed events ignored", style="red")
    return Panel(body, title=title, title_align="left")


def _node_table(state: DashboardState) -> Table:
    if len(state.nodes) > MAX_ROWS:
        return _summary_table(state)
    table = Table(expand=False, show_edge=False, pad_edge=False)
    for name, justify in (("node", "left"), ("state", "left"), (state.unit, "right"),
                          ("up", "right"), ("down", "right"), ("loss", "right"), ("progress", "left")):
        table.add_column(name, justify=justify, no_wrap=True)
    views = list(state.nodes.values())
    for v in views[:MAX_ROWS]:
        table.add_row(
            v.name,
            Text(v.state, style=STATE_STYLES.get(v.state, "")),
            "-" if v.round is None else str(v.round),
            human_bytes(v.bytes_up),
            human_bytes(v.bytes_down),
            "-" if v.loss is None else f"{v.loss:.4f}",
            v.detail,
        )
    if len(views) > MAX_ROWS:
        table.add_row(f"… {len(views) - MAX_ROWS} more", "", "", "", "", "", "")
    return table


# With more nodes than MAX_ROWS: one row per state (how many, their bytes, their mean
# loss), then the nodes at work (the controller and who trains or uploads), at most this many.
BUSY_ROWS = 12
_BUSY = (COLLECTING, AGGREGATING, TRAINING, UPLOADING)


def _summary_table(state: DashboardState) -> Table:
    """Many nodes (a thousand clients): a summary by state, not a thousand rows."""
    table = Table(expand=False, show_edge=False, pad_edge=False)
    for name, justify in (("state", "left"), ("nodes", "right"), ("up", "right"), ("down", "right"),
                          ("mean loss", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    by_state: dict[str, list[NodeView]] = {}
    for v in state.nodes.values():
        by_state.setdefault(v.state, []).append(v)
    for name in sorted(by_state, key=lambda st: (-len(by_state[st]), st)):
        views = by_state[name]
        losses = [v.loss for v in views if v.loss is not None]
        table.add_row(Text(name, style=STATE_STYLES.get(name, "")), str(len(views)),
                      human_bytes(sum(v.bytes_up for v in views)), human_bytes(sum(v.bytes_down for v in views)),
                      "-" if not losses else f"{sum(losses) / len(losses):.4f}")
    busy = [v for v in state.nodes.values() if v.state in _BUSY]
    for v in busy[:BUSY_ROWS]:
        table.add_row(Text(f"  {v.name}", style=STATE_STYLES.get(v.state, "")), v.state,
                      human_bytes(v.bytes_up), human_bytes(v.bytes_down),
                      "-" if v.loss is None else f"{v.loss:.4f}")
    if len(busy) > BUSY_ROWS:
        table.add_row(f"  … {len(busy) - BUSY_ROWS} more at work", "", "", "", "")
    return table


def render(state: DashboardState, title: str = "dtemu", elapsed_s: float | None = None):
    """The whole dashboard as one rich renderable."""
    recent = Text("\n".join(event_line(ev) for ev in list(state.recent)) or "(no events yet)",
                  no_wrap=True, overflow="ellipsis")
    return Group(
        _header(state, title, elapsed_s),
        _node_table(state),
        Panel(recent, title="recent events", title_align="left"),
    )


