"""Evaluation is the experimenter's instrument: it takes none of the run's time, and a failed one is logged."""

import threading
import time

from dtemu.emu.run import run_emulation
from dtemu.host.rundir import read_events
from dtemu.real.aside import Aside
from test_fl_protocol import StandIn, of, scenario


class FailingEval(StandIn):
    def evaluate(self, weights):
        if weights.mean() > 0.03:  # from round 2 on (0.02 a round)
            raise ValueError("the test set is gone")
        return super().evaluate(weights)


def test_emu_logs_each_evaluation_at_its_round_and_a_failed_one_with_its_error(tmp_path):
    summary = run_emulation(scenario(), tmp_path / "run", work=FailingEval())
    evals = of(read_events(tmp_path / "run"), "eval")
    assert [e["round"] for e in evals] == [1, 2, 3]
    assert evals[0]["accuracy"] is not None and "error" not in evals[0]
    assert evals[1]["accuracy"] is None and "ValueError: the test set is gone" in evals[1]["error"]
    # the run went on; its final accuracy is the last evaluation that gave one
    assert summary["rounds"] == 3 and summary["final_accuracy"] == evals[0]["accuracy"]


def test_work_aside_runs_in_order_off_the_callers_thread_and_survives_errors():
    aside, seen = Aside(), []
    caller = threading.get_ident()

    def slow(i):
        def fn():
            time.sleep(0.05)
            assert threading.get_ident() != caller
            if i == 1:
                raise RuntimeError("boom")
            return i
        return fn

    t0 = time.monotonic()
    for i in range(3):
        aside.submit(slow(i), lambda value, error=None: seen.append((value, type(error).__name__)))
    assert time.monotonic() - t0 < 0.05  # submitting does not wait
    aside.join()
    assert seen == [(0, "NoneType"), (None, "RuntimeError"), (2, "NoneType")]
