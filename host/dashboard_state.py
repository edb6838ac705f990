"""The dashboard's state: every event folded into what is worth showing (pure, testable without a
terminal; host.dashboard draws it live, host.dashboard_render turns it into a rich renderable).
Both runtimes feed it, so nothing here knows whether ``t`` is virtual (emu) or wall-clock (real)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

from dtemu.core import events as kinds
from dtemu.core.wire.topics import CLIENT_UPDATE
from dtemu.host import progress

RECENT_EVENTS = 8
# A flood of made-up client names must not turn the table into a scroll.
MAX_ROWS = 40

# Client states.
STARTING = "starting"  # real launch: the process is starting (imports, data, DDS) and not yet up
WAITING = "waiting"  # up, waiting for a command (or for the model it needs)
TRAINING = "training"
UPLOADING = "uploading"
IDLE = "idle"  # its update is sent; nothing to do until the next command
DROPPED = "dropped"  # sits out the current round (the dropout fault)
OFFLINE = "offline"  # crashed or switched off
STOPPED = "stopped"  # told to stop: the run is over for it
UNKNOWN = "unknown"  # only named by others (a client the controller heard from)
# Controller states.
COLLECTING = "collecting"  # a round is open, updates are coming in
AGGREGATING = "aggregating"  # the round is closed: aggregate, checkpoint, evaluate
DONE = "done"

STATE_STYLES = {
    STARTING: "dim italic",
    WAITING: "dim",
    TRAINING: "bold yellow",
    UPLOADING: "bold cyan",
    IDLE: "green",
    DROPPED: "magenta",
    OFFLINE: "bold red",
    STOPPED: "dim",
    UNKNOWN: "dim italic",
    COLLECTING: "bold cyan",
    AGGREGATING: "bold yellow",
    DONE: "green",
}

# Client-side events that set the node's state outright.
_CLIENT_STATES = {
    kinds.TRAIN_START: TRAINING,
    kinds.UPLOAD_START: UPLOADING,
    kinds.UPLOAD_DONE: IDLE,
    kinds.UPDATE_NOT_FINITE: IDLE,  # diverged: nothing to send until the next command
    kinds.TRAIN_FAILED: IDLE,  # its task raised: nothing to send until the next command
    kinds.CLIENT_STOP: STOPPED,
    kinds.DROPOUT: DROPPED,
    kinds.NODE_DOWN: OFFLINE,
    kinds.NODE_UP: WAITING,
    kinds.NODE_STARTING: STARTING,
}
# Too frequent to be news; they show up as bytes in the table instead.
_QUIET_KINDS = frozenset({kinds.DELIVER})
_UPDATE_TOPIC = CLIENT_UPDATE


@dataclass
class NodeView:
    name: str
    state: str = WAITING
    round: int | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    loss: float | None = None
    # Clients report their own uploads (upload_done); for them the
    # controller-side delivery of the same update must not count twice.
    reports_uploads: bool = False
    # The mode's own progress (host.progress): a short line, and what it is made of.
    detail: str = ""
    iterations: int = 0
    wan_bytes: int = 0


class DashboardState:
    """Everything the dashboard shows, folded from events one at a time."""

    def __init__(self, node_names: Iterable[str], rounds_total: int | None = None, unit: str = "round"):
        self.unit = unit  # what the run counts: rounds (or global versions), or steps (ddp)
        self.nodes: dict[str, NodeView] = {}
        for name in node_names:
            self._node(name)
        self.rounds_total = rounds_total
        self.round: int | None = None
        self.attempt = 0
        self.t = 0.0
        self.accuracy: float | None = None
        self.accuracy_round: int | None = None
        self.rounds_failed = 0
        self.accepted = 0
        self.late = 0
        self.rejected = 0
        self.end_reason: str | None = None
        self.testbed_why: list[str] = []  # real launch --machines: what the fidelity monitors say is wrong
        self.events_seen = 0
        # Events that could not be folded in (a malformed field): counted, never raised.
        self.bad_events = 0
        self.recent: deque[dict] = deque(maxlen=RECENT_EVENTS)
        self._dropped: set[str] = set()
        self.sampled: tuple[int, int] | None = None  # (asked, available) in a sampled round

    @classmethod
    def from_scenario(cls, scenario) -> DashboardState:
        return cls(scenario.node_names, scenario.kind.rounds(scenario), scenario.kind.unit)

    # --- folding events -------------------------------------------------
    def observe(self, event: dict) -> None:
        """Fold one event in; O(1), and a malformed event never raises."""
        try:
            self._apply(event)
        except Exception:
            self.bad_events += 1

    def _node(self, name: Any, state: str = WAITING) -> NodeView:
        name = str(name)
        view = self.nodes.get(name)
        if view is None:
            view = self.nodes[name] = NodeView(name, state)
        return view

    def _named(self, name: Any) -> NodeView:
        """A node another node's event names: we know it exists, not what it does."""
        return self._node(name, UNKNOWN)

    def _apply(self, ev: dict) -> None:
        self.events_seen += 1
        kind = ev.get("kind")
        if kind == kinds.TESTBED:   # the launcher's monitors, about no node
            why = ev.get("why")
            self.testbed_why = [str(w) for w in why] if isinstance(why, list) and not ev.get("faithful") else []
            return
        t = ev.get("t")
        if isinstance(t, (int, float)):
            self.t = float(t)
        node = self._node(ev.get("node", "?"))
        if node.state == UNKNOWN:
            node.state = WAITING  # it speaks for itself now
        if kind not in _QUIET_KINDS:
            self.recent.append(ev)

        if kind == kinds.DELIVER:
            size = int(ev.get("bytes") or 0)
            node.bytes_down += size
            src = self._named(ev.get("src", "?"))
            if not (ev.get("topic") == _UPDATE_TOPIC and src.reports_uploads):
                src.bytes_up += size
            return

        if kind in _CLIENT_STATES:
            node.state = _CLIENT_STATES[kind]
            if node.state == DROPPED:
                self._dropped.add(node.name)
            else:
                self._dropped.discard(node.name)
            if "round" in ev:
                node.round = ev["round"]
            if kind == kinds.UPLOAD_START:
                node.reports_uploads = True
                if ev.get("loss") is not None:
                    node.loss = float(ev["loss"])
                if ev.get("steps") is not None:   # local steps (ESync's: as many as the state server let it)
                    node.iterations += int(ev["steps"])
                    node.detail = f"{ev['steps']} steps this round, {node.iterations} in all"
            elif kind == kinds.UPLOAD_DONE:
                node.reports_uploads = True
                node.bytes_up += int(ev.get("bytes") or 0)
            return

        handler = _CONTROLLER_HANDLERS.get(kind) or progress.HANDLERS.get(kind)
        if handler is not None:
            handler(self, node, ev)

    # Controller events, one small method each.
    def _run_start(self, node: NodeView, ev: dict) -> None:
        clients = ev.get("clients")
        for name in clients if isinstance(clients, list) else ():
            self._node(name)
        if ev.get("rounds"):
            self.rounds_total = ev["rounds"]

    def _round_start(self, node: NodeView, ev: dict) -> None:
        self.round = ev.get("round")
        self.attempt = ev.get("attempt") or 0
        node.state, node.round = COLLECTING, self.round
        # "Dropped" holds for one round only: a new round starts them afresh.
        # Only the dropped are visited, so observe stays cheap with many nodes.
        for name in list(self._dropped):
            view = self.nodes[name]
            if view.round is None or self.round is None or view.round < self.round:
                view.state = WAITING
                self._dropped.discard(name)

    def _sampled(self, node: NodeView, ev: dict) -> None:
        self.sampled = (int(ev["asked"]), int(ev["available"]))

    def _round_close(self, node: NodeView, ev: dict) -> None:
        node.state = AGGREGATING

    def _round_failed(self, node: NodeView, ev: dict) -> None:
        self.rounds_failed += 1

    def _eval(self, node: NodeView, ev: dict) -> None:
        self.accuracy = float(ev["accuracy"])
        self.accuracy_round = ev.get("round")

    def _run_end(self, node: NodeView, ev: dict) -> None:
        node.state = DONE
        self.end_reason = str(ev.get("reason", ""))
        # The controller's own count survives a resume; ours starts at zero.
        if isinstance(ev.get("rounds_failed"), int):
            self.rounds_failed = ev["rounds_failed"]

    def _update_accepted(self, node: NodeView, ev: dict) -> None:
        self.accepted += 1
        self._named(ev.get("client", "?"))

    def _update_late(self, node: NodeView, ev: dict) -> None:
        self.late += 1
        self._named(ev.get("client", "?"))

    def _update_rejected(self, node: NodeView, ev: dict) -> None:
        self.rejected += 1
        self._named(ev.get("client", ev.get("src", "?")))

    def _node_event(self, node: NodeView, ev: dict) -> None:
        """Client events that name another node (message_rejected's src)."""
        if "src" in ev:
            self._named(ev["src"])


_CONTROLLER_HANDLERS = {
    kinds.RUN_START: DashboardState._run_start,
    kinds.ROUND_START: DashboardState._round_start,
    kinds.ROUND_CLOSE: DashboardState._round_close,
    kinds.SAMPLED: DashboardState._sampled,
    kinds.ROUND_FAILED: DashboardState._round_failed,
    kinds.EVAL: DashboardState._eval,
    kinds.RUN_END: DashboardState._run_end,
    kinds.UPDATE_ACCEPTED: DashboardState._update_accepted,
    kinds.UPDATE_LATE: DashboardState._update_late,
    kinds.UPDATE_REJECTED: DashboardState._update_rejected,
    kinds.MESSAGE_REJECTED: DashboardState._node_event,
}


