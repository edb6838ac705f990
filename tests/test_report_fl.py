"""The FL report labels runs by what differs, counts bytes per round attempted, reads killed runs,
and shows who took part in each round."""

from dtemu.report import report
from test_fl_faults import run, scenario


def test_runs_that_differ_in_one_key_are_labelled_by_it(tmp_path):
    run(tmp_path, scenario(**{"network.default.up_mbps": 1000}), name="fast")
    run(tmp_path, scenario(**{"network.default.up_mbps": 10}), name="slow")
    runs = [report.load_run(tmp_path / "fast"), report.load_run(tmp_path / "slow")]
    assert report.run_labels(runs) == ["fp32 up_mbps=1000.0", "fp32 up_mbps=10.0"]
    assert report.what_differs(runs) == "up_mbps"


def test_bytes_per_round_counts_failed_rounds_too(tmp_path):
    """Rounds that fail (min_clients 3 while one client is off) still sent commands and models."""
    offline = {"offline": [{"node": "client3", "start_s": 1.5, "end_s": 6.0}]}
    summary, _ = run(tmp_path, scenario(offline, **{"fl.min_clients": 3}), name="r")
    assert summary["rounds_failed"] >= 1
    r = report.load_run(tmp_path / "r")
    attempted = report.fl_rounds_attempted(r)
    assert attempted == summary["rounds"] + summary["rounds_failed"]
    assert report.fl_bytes_per_round(r) == (summary["bytes_up"] + summary["bytes_down"]) / attempted


def test_a_killed_run_is_reported_as_far_as_it_got(tmp_path):
    run(tmp_path, scenario(), name="killed")
    folder = tmp_path / "killed"
    (folder / "summary.json").unlink()
    r = report.load_run(folder)
    assert not r.finished and report.run_labels([r]) == ["fp32 (unfinished)"]
    assert report.fl_table([r])[0]["bytes_total"] is None
    files, _ = report.write_fl_report([r], tmp_path / "out")
    assert "Unfinished" in (tmp_path / "out" / "report.md").read_text() and len(files) == 8


def test_participation_says_who_was_accepted_dropped_or_offline(tmp_path):
    faults = {"dropout_p": 0.4, "offline": [{"node": "client2", "start_s": 1.5, "end_s": 4.5}]}
    run(tmp_path, scenario(faults), name="p")
    clients, rounds, state = report.fl_participation(report.load_run(tmp_path / "p"))
    assert clients == ["client1", "client2", "client3"] and rounds == [1, 2, 3, 4]
    kinds = set(state.values())
    assert {"accepted", "dropped", "offline"} <= kinds, state
