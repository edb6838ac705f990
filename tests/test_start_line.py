"""real launch: scenario times count from the instant every rank is up, not from the launch."""

from dtemu.core.scenario import parse_scenario
from dtemu.real import start_line
from dtemu.real.launch import _Schedule


def test_a_rank_waits_at_the_start_line_and_takes_its_origin(tmp_path, monkeypatch):
    monkeypatch.delenv(start_line.START_FILE, raising=False)
    assert start_line.wait_for_start(tmp_path) is None  # not launched: its own clock
    path = tmp_path / "start.json"
    monkeypatch.setenv(start_line.START_FILE, str(path))
    start_line.write_start(path, 1234.5)
    folder = tmp_path / "rank1"
    folder.mkdir()
    assert start_line.wait_for_start(folder) == 1234.5
    assert start_line.is_ready(folder)


def test_a_torn_or_foreign_start_file_is_not_an_origin(tmp_path):
    path = tmp_path / "start.json"
    for text in ("", "{", '{"origin": "soon"}', "[1]", '{"other": 1}'):
        path.write_text(text)
        assert start_line.read_start(path) is None


def test_offline_windows_count_from_the_origin():
    s = parse_scenario({"name": "t", "fl": {"clients": 2},
                        "faults": {"offline": [{"node": "client1", "start_s": 5, "end_s": 9},
                                               {"node": "client2", "start_s": 0, "end_s": 3}]}})
    sched = _Schedule(s)
    # client2, down from the start, is started with the others and held until 3 s after the origin
    assert not sched.down_at_start(2) and not sched.down_at_start(1) and sched.held == {2: 3}
    assert sched.due_kills(1e12) == [] and sched.due_starts(1e12) == []  # nothing before the origin
    sched.begin(1000.0)
    assert sched.due_kills(1004.9) == [] and sched.due_kills(1005.0) == [1]
    assert sched.due_starts(1003.0) == [] and sched.due_starts(1009.0) == [(1, 1009.0)]
    assert not sched.killed(2)   # its exit is its own, not an offline window's


def test_a_start_is_made_early_by_the_start_up_time_and_held_to_its_time():
    s = parse_scenario({"name": "t", "fl": {"clients": 2},
                        "faults": {"offline": [{"node": "client1", "start_s": 5, "end_s": 9},
                                               {"node": "client2", "start_s": 5, "end_s": 6}]}})
    sched = _Schedule(s)
    sched.begin(1000.0, lead=3.0)
    assert sched.due_starts(1004.9) == []  # client1 from 1006; client2 not before its kill at 1005
    assert sched.due_kills(1005.0) == [1, 2]
    assert sched.due_starts(1005.0, idle=lambda r: r != 2) == []  # client2's process not reaped yet
    assert sched.due_starts(1005.0) == [(2, 1006.0)]
    assert sched.due_starts(1006.0) == [(1, 1009.0)] and sched.pending(1) is False
    sched.restart_at(1, 1020.0)  # a crash restart: started at once, up at its time
    assert sched.pending(1) and sched.due_starts(1017.0) == [(1, 1020.0)]


def test_a_rank_that_never_comes_is_not_started():
    s = parse_scenario({"name": "t", "fl": {"clients": 2}, "faults": {"offline": [{"node": "client2", "start_s": 0}]}})
    sched = _Schedule(s)
    assert sched.down_at_start(2) and sched.held == {} and sched.killed(2)


def test_a_held_rank_waits_for_the_origin_and_its_window_end(tmp_path, monkeypatch):
    import time
    path = tmp_path / "start.json"
    monkeypatch.setenv(start_line.START_FILE, str(path))
    monkeypatch.setenv(start_line.HOLD, "0.3")
    start_line.write_start(path, time.time())
    t0 = time.monotonic()
    start_line.hold_until_window_end()
    assert 0.25 <= time.monotonic() - t0 < 2.0
    monkeypatch.delenv(start_line.HOLD)
    t0 = time.monotonic()
    start_line.hold_until_window_end()   # not held: at once
    assert time.monotonic() - t0 < 0.1
