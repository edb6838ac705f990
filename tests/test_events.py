"""Event kinds are declared once (dtemu.core.events) and every writer keeps to them."""

import re
from pathlib import Path

from dtemu.core import events as ev
from dtemu.core.runtime import points
from dtemu.core.runtime.faults import CRASH_POINTS
from dtemu.core.scenario import CLIENT_CRASH_POINTS, CONTROLLER_CRASH_POINTS
from test_fl_faults import run, scenario

ROOT = Path(__file__).resolve().parents[1]

EVERY_FAULT = {
    "crashes": [{"node": "client1", "round": 1, "at": "before_train", "restart_after_s": 0.2},
                {"node": "client2", "round": 2, "at": "mid_upload", "restart_after_s": 0.2},
                {"node": "controller", "round": 3, "at": "before_checkpoint", "restart_after_s": 0.5}],
    "offline": [{"node": "client3", "start_s": 1.0, "end_s": 2.5}],
    "partitions": [{"nodes": ["client2"], "start_s": 4, "end_s": 5}],
    "message_loss": 0.05, "duplicate_p": 0.1, "reorder_s": 0.05, "dropout_p": 0.2,
    "corrupt": [{"node": "client1", "kind": "nan", "rounds": [4]}],
}


def test_a_run_with_every_fault_logs_only_declared_events(tmp_path):
    _, events = run(tmp_path, scenario(EVERY_FAULT))
    assert ev.problems(events) == []
    kinds = {e["kind"] for e in events}
    assert {ev.FAULT, ev.DROPOUT, ev.NODE_DOWN, ev.DELIVER, ev.ROUND_CLOSE, ev.RUN_END} <= kinds


def test_check_names_what_is_wrong():
    assert ev.check({"t": 0, "node": "a", "kind": "no_such_kind"}) == "unknown event kind 'no_such_kind'"
    assert ev.check({"t": 0, "node": "a", "kind": "round_start", "round": 1}) == "round_start: missing attempt"
    assert "undeclared extra" in ev.check({"t": 0, "node": "a", "kind": "dropout", "round": 1, "extra": 2})
    assert ev.check({"t": 0, "node": "a", "kind": ev.DROPOUT, "round": 1}) is None


def test_writers_name_kinds_by_their_constants():
    """No event kind is a bare string in the product's code: a rename is one edit."""
    bare = re.compile(r"""\bemit\(\s*(?:[\w.]+,\s*)?["']""")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for folder in ("core", "emu", "real", "host", "report")
                 for p in (ROOT / folder).rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if bare.search(line)]
    assert offenders == []


def test_every_crash_point_is_a_protocol_point():
    assert set(CRASH_POINTS) == set(CLIENT_CRASH_POINTS) | set(CONTROLLER_CRASH_POINTS)
    assert {point for point, _ in CRASH_POINTS.values()} <= set(points.ALL)


class _Prims:
    node, incarnation, bytes_rejected = "controller", 0, 0

    def __init__(self):
        self.t, self.logged = 0.0, []

    def now(self):
        return self.t

    def log(self, event):
        self.logged.append(event)


def test_events_of_untrusted_origin_are_rate_limited_per_origin():
    from dtemu.core.runtime.driver import Driver

    prims = _Prims()
    driver = Driver(prims, faults=None)
    for _ in range(1000):
        driver.emit(ev.UPDATE_REJECTED, src="evil", reason="forged")
    driver.emit(ev.UPDATE_REJECTED, src="client1", reason="late")  # an honest origin has its own budget
    assert len(prims.logged) == ev.REFUSALS_PER_S + 1
    prims.t = 1.5
    driver.emit(ev.UPDATE_REJECTED, src="evil", reason="forged")
    assert prims.logged[-2] == {"t": 1.5, "node": "controller", "kind": ev.EVENTS_SUPPRESSED,
                                "of": "update_rejected", "origin": "evil", "suppressed": 1000 - ev.REFUSALS_PER_S}
    assert ev.problems(prims.logged) == []
    for _ in range(5):
        driver.emit(ev.ROUND_START, round=1, attempt=0)  # not limited
    assert len(prims.logged) == ev.REFUSALS_PER_S + 3 + 5
