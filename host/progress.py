"""What each mode's own events add to the live dashboard (host.dashboard): a node's state, its
round (or step), and a short ``detail`` of the mode's own progress.

    geo         a role's rounds, its compute and push-to-pull time (workers), its wait and WAN time
                and WAN bytes (PSs)
    ddp         a worker's steps with the compute / communication split

One small function per event kind, keyed by the kind (core.events), as the dashboard's FL
handlers are: an event of a kind no mode here emits is simply not folded in.
"""

from __future__ import annotations

from typing import Any, Callable

from dtemu.core import events as kinds

TRAINING, DONE = "training", "done"  # (host.dashboard_state's names for these states)


def _ms(seconds: Any) -> str:
    return f"{float(seconds) * 1e3:.0f} ms"


def ddp_start(state, node, ev: dict) -> None:
    node.state = TRAINING


def ddp_step(state, node, ev: dict) -> None:
    node.state, node.round = TRAINING, int(ev["step"]) + 1   # (steps done: the event's step counts from 0)
    state.round = max(state.round or 0, node.round)
    node.loss = float(ev["loss"])
    node.detail = f"compute {_ms(ev['compute_s'])}, comm {_ms(ev['comm_s'])}"


def ddp_window(state, node, ev: dict) -> None:
    node.state, node.round = TRAINING, int(ev["first_step"]) + int(ev["steps"])
    state.round = max(state.round or 0, node.round)
    node.detail = f"compute {_ms(ev['compute_s_mean'])}, comm {_ms(ev['comm_s_mean'])} (mean of {ev['steps']})"


def geo_step(state, node, ev: dict) -> None:
    node.state, node.round = TRAINING, int(ev["round"])
    node.loss = float(ev["loss"])
    node.detail = f"compute {_ms(ev['compute_s'])}, push to pull {_ms(ev['comm_s'])}"


def geo_round(state, node, ev: dict) -> None:
    node.round = int(ev["round"])
    state.round = max(state.round or 0, node.round)
    node.wan_bytes += int(ev["bytes_up"]) + int(ev["bytes_down"])
    node.detail = f"waited {_ms(ev['wait_s'])}, WAN {_ms(ev['wan_s'])}, {node.wan_bytes / 1e6:.2f} MB"


def finished(state, node, ev: dict) -> None:
    node.state = DONE
    if ev.get("stop_reason"):
        node.detail = f"{node.detail}; {ev['stop_reason']}" if node.detail else str(ev["stop_reason"])


HANDLERS: dict[str, Callable[[Any, Any, dict], None]] = {
    kinds.WORKER_START: ddp_start,
    kinds.STEP: ddp_step,
    kinds.WINDOW: ddp_window,
    kinds.WORKER_END: finished,
    kinds.GEO_STEP: geo_step,
    kinds.GEO_ROUND: geo_round,
    kinds.GEO_END: finished,
    kinds.SS_END: finished,
}
