"""The dashboard's state machine and rendering, and the report on synthetic run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from dtemu.report import report
from dtemu.host.dashboard import (
    DONE,
    DROPPED,
    IDLE,
    OFFLINE,
    TRAINING,
    UNKNOWN,
    UPLOADING,
    WAITING,
    Dashboard,
    DashboardState,
    render,
)

# --- synthetic run folders ----------------------------------------------------

BLOB_BYTES = 5000


def write_run(folder: Path, *, codec: str, update_bytes: int, round_s: list[float],
              name: str = "fl_small", clients: int = 2, upload_comm_s: float = 0.01,
              download_comm_s: float = 0.02, runtime: str = "emu") -> Path:
    """A plausible finished FL run: every client answers every round."""
    names = [f"client{i}" for i in range(1, clients + 1)]
    events, t = [], 0.0

    def ev(node, kind, **fields):
        events.append({"t": round(t, 6), "node": node, "kind": kind, **fields})

    ev("controller", "run_start", clients=names, rounds=len(round_s), first_round=1, dim=100)
    for r, duration in enumerate(round_s, start=1):
        start = t
        ev("controller", "round_start", round=r, attempt=0)
        for c in names:
            ev(c, "train_start", round=r, samples=64)
            ev(c, "upload_start", round=r, bytes=update_bytes, steps=1, loss=1.0 / r)
            ev("controller", "deliver", src=c, topic="train/client_update", bytes=update_bytes,
               sent_at=t, comm_s=upload_comm_s)
            ev(c, "upload_done", round=r, bytes=update_bytes)
            ev("controller", "update_accepted", client=c, round=r, bytes=update_bytes,
               num_samples=64, sent_at=t, comm_s=upload_comm_s)
        t = start + duration
        ev("controller", "round_close", round=r, ready=clients, expected=clients, min=1,
           clients=names, timed_out=False, note="")
        ev("controller", "aggregated", round=r, model_sha256="ab")
        for c in names:
            ev(c, "deliver", src="controller", topic="train/model_blob", bytes=BLOB_BYTES,
               sent_at=t, comm_s=download_comm_s)
        ev("controller", "eval", round=r, accuracy=0.5 + 0.1 * r)
    ev("controller", "run_end", reason="done", rounds_completed=len(round_s), rounds_failed=0,
       model_sha256="ab", counts={"accepted": clients * len(round_s)})

    rounds = len(round_s)
    summary = {
        "scenario": name, "runtime": runtime, "mode": "fl", "codec": codec, "seed": 0,
        "final_accuracy": 0.5 + 0.1 * rounds, "rounds": rounds, "rounds_failed": 0,
        "stop_reason": "done",
        "bytes_up": rounds * clients * update_bytes,
        "bytes_down": rounds * clients * BLOB_BYTES,
        "wire_bytes": 0, "updates": {"accepted": clients * rounds}, "model_sha256": "ab",
        "time_s": t, "wall_time_s": 1.5,
    }
    scenario = {"name": name, "mode": "fl", "seed": 0, "model": "mnist_cnn",
                "fl": {"clients": clients, "rounds": rounds, "codec": codec}}
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "scenario.json").write_text(json.dumps(scenario))
    return folder


@pytest.fixture
def codec_runs(tmp_path):
    return [
        write_run(tmp_path / "fp32", codec="fp32", update_bytes=4000, round_s=[1.0, 2.0, 3.0]),
        write_run(tmp_path / "q8", codec="q8", update_bytes=1000, round_s=[0.5, 0.5, 0.5, 0.5],
                  upload_comm_s=0.004),
        write_run(tmp_path / "s4", codec="s4", update_bytes=200, round_s=[0.25, 0.75]),
    ]


# --- report -------------------------------------------------------------------


def test_report_main_writes_figures_and_table(codec_runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main([str(p) for p in codec_runs] + ["--out", str(out)]) == 0
    for name in ("bytes.png", "comm_time.png", "round_time.png", "accuracy.png"):
        png = out / name
        assert png.exists() and png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "| fp32 |" in md and "| q8 |" in md and "| s4 |" in md
    assert "| q8 | emu | 4 |" in md
    assert "| fp32 |" in capsys.readouterr().out


def test_fl_table_numbers(codec_runs):
    rows = {row["label"]: row for row in report.fl_table([report.load_run(p) for p in codec_runs])}
    assert set(rows) == {"fp32", "q8", "s4"}
    assert rows["fp32"]["bytes_per_update"] == 4000
    assert rows["q8"]["bytes_per_update"] == 1000
    assert rows["fp32"]["vs_fp32"] == 1.0
    assert rows["q8"]["vs_fp32"] == pytest.approx(0.25)
    assert rows["s4"]["vs_fp32"] == pytest.approx(0.05)
    # (up + down) per round = clients * (update + blob)
    assert rows["fp32"]["bytes_per_round"] == pytest.approx(2 * (4000 + BLOB_BYTES))
    assert rows["fp32"]["round_time_s"] == pytest.approx(2.0)
    assert rows["q8"]["round_time_s"] == pytest.approx(0.5)
    assert rows["s4"]["round_time_s"] == pytest.approx(0.5)
    assert rows["q8"]["upload_comm_s"] == pytest.approx(0.004)
    assert rows["fp32"]["rounds"] == 3
    assert rows["fp32"]["final_accuracy"] == pytest.approx(0.8)
    assert rows["fp32"]["clock"] == "sim" and rows["fp32"]["time_s"] == pytest.approx(6.0)


def test_per_client_comm_and_curves(codec_runs):
    run = report.load_run(codec_runs[0])
    assert run.client_names() == ["client1", "client2"]
    assert report.fl_upload_comm_by_client(run) == {"client1": 0.01, "client2": 0.01}
    assert report.fl_download_comm_by_client(run) == {"client1": 0.02, "client2": 0.02}
    assert [r for r, _ in report.fl_accuracy_curve(run)] == [1, 2, 3]


def test_round_times_count_each_attempt(tmp_path):
    folder = write_run(tmp_path / "r", codec="fp32", update_bytes=10, round_s=[1.0])
    run = report.load_run(folder)
    # A retried round 2: two attempts, each timed on its own.
    run.events += [
        {"t": 10.0, "node": "controller", "kind": "round_start", "round": 2, "attempt": 0},
        {"t": 14.0, "node": "controller", "kind": "round_close", "round": 2},
        {"t": 15.0, "node": "controller", "kind": "round_start", "round": 2, "attempt": 1},
        {"t": 17.0, "node": "controller", "kind": "round_close", "round": 2},
    ]
    assert report.fl_round_times(run) == [(1, 0, 1.0), (2, 0, 4.0), (2, 1, 2.0)]


def test_labels_name_the_scenario_and_runtime_when_runs_differ(tmp_path):
    a = write_run(tmp_path / "a", codec="fp32", update_bytes=100, round_s=[1.0], name="lan")
    b = write_run(tmp_path / "b", codec="fp32", update_bytes=100, round_s=[1.0], name="wan")
    c = write_run(tmp_path / "c", codec="fp32", update_bytes=100, round_s=[1.0], name="wan",
                  runtime="real")
    runs = [report.load_run(p) for p in (a, b, c)]
    assert report.run_labels(runs) == ["lan fp32 (emu)", "wan fp32 (emu)", "wan fp32 (real)"]
    rows = report.fl_table(runs)
    assert [r["clock"] for r in rows] == ["sim", "sim", "wall"]


def test_report_refuses_a_folder_without_summary(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "events.jsonl").write_text("")
    assert report.main([str(tmp_path / "half"), "--out", str(tmp_path / "out")]) == 2
    assert "summary.json" in capsys.readouterr().err


def test_a_truncated_last_event_line_is_skipped(codec_runs):
    path = codec_runs[0] / "events.jsonl"
    path.write_text(path.read_text() + '{"t": 9, "node": "contr')
    run = report.load_run(codec_runs[0])
    assert run.bad_lines == 1 and run.of("run_end")


# --- dashboard ----------------------------------------------------------------


def ev(t, node, kind, **fields):
    return {"t": t, "node": node, "kind": kind, **fields}


def test_dashboard_state_follows_the_run():
    s = DashboardState(["controller", "client1", "client2"], rounds_total=5)
    assert s.nodes["client1"].state == WAITING
    s.observe(ev(0.0, "controller", "round_start", round=1, attempt=0))
    assert (s.round, s.attempt) == (1, 0)

    s.observe(ev(0.1, "client1", "train_start", round=1, samples=64))
    assert s.nodes["client1"].state == TRAINING and s.nodes["client1"].round == 1
    s.observe(ev(0.2, "client1", "upload_start", round=1, bytes=400, steps=2, loss=0.75))
    assert s.nodes["client1"].state == UPLOADING and s.nodes["client1"].loss == 0.75
    s.observe(ev(0.3, "controller", "deliver", src="client1", topic="train/client_update",
                 bytes=400, sent_at=0.2, comm_s=0.1))
    s.observe(ev(0.3, "client1", "upload_done", round=1, bytes=400))
    assert s.nodes["client1"].state == IDLE
    # The update counts once for its sender, once for the controller's download.
    assert s.nodes["client1"].bytes_up == 400
    assert s.nodes["controller"].bytes_down == 400

    s.observe(ev(0.3, "client2", "dropout", round=1))
    assert s.nodes["client2"].state == DROPPED
    s.observe(ev(0.35, "controller", "update_accepted", client="client1", round=1, bytes=400,
                 num_samples=64, sent_at=0.2, comm_s=0.1))
    s.observe(ev(0.36, "controller", "update_late", client="client2", round=0, current=1))
    s.observe(ev(0.37, "controller", "update_rejected", client="stranger", round=1,
                 reason="unknown client"))
    assert s.nodes["stranger"].state == UNKNOWN
    assert (s.accepted, s.late, s.rejected) == (1, 1, 1)

    s.observe(ev(0.4, "controller", "round_close", round=1, ready=1, expected=2, min=1,
                 clients=["client1"], timed_out=True, note=""))
    s.observe(ev(0.5, "client1", "deliver", src="controller", topic="train/model_blob",
                 bytes=1000, sent_at=0.45, comm_s=0.05))
    assert s.nodes["client1"].bytes_down == 1000 and s.nodes["controller"].bytes_up == 1000
    s.observe(ev(0.6, "controller", "eval", round=1, accuracy=0.91))
    assert s.accuracy == 0.91

    # A new round ends the dropout; a crash makes a node offline.
    s.observe(ev(1.0, "controller", "round_start", round=2, attempt=0))
    assert s.nodes["client2"].state == WAITING and s.round == 2
    s.observe(ev(1.1, "client2", "node_down"))
    assert s.nodes["client2"].state == OFFLINE
    s.observe(ev(1.2, "controller", "round_failed", round=2, ready=0, min=1, policy="retry"))
    s.observe(ev(1.3, "controller", "round_start", round=2, attempt=1))
    assert s.nodes["client2"].state == OFFLINE and s.attempt == 1 and s.rounds_failed == 1
    s.observe(ev(2.0, "controller", "run_end", reason="done", rounds_completed=1, rounds_failed=1,
                 model_sha256="ab", counts={}))
    assert s.nodes["controller"].state == DONE and s.end_reason == "done" and s.t == 2.0
    # Recent events leave deliveries out and keep only the last few.
    kinds = [e["kind"] for e in s.recent]
    assert "deliver" not in kinds and len(kinds) == 8 and kinds[-1] == "run_end"


def test_dashboard_state_never_raises():
    s = DashboardState(["controller"])
    s.observe({})
    s.observe(ev("soon", "controller", "eval", accuracy="high"))
    s.observe(ev(1.0, "client9", "deliver", src="controller", bytes="lots"))
    assert s.bad_events == 2
    s.observe(ev(2.0, "controller", "update_rejected", src="stranger", reason="malformed", error="x"))
    assert "stranger" in s.nodes and s.rejected == 1


def test_render_shows_every_node():
    s = DashboardState(["controller", "client1", "client2"], rounds_total=3)
    s.observe(ev(0.1, "client1", "train_start", round=1, samples=64))
    s.observe(ev(0.2, "controller", "update_rejected", client="stranger", round=1, reason="unknown client"))
    console = Console(record=True, width=120)
    console.print(render(s, title="fl_small (emu)"))
    text = console.export_text()
    for name in ("controller", "client1", "client2", "stranger", "fl_small (emu)", "training", "round -/3"):
        assert name in text, name


def _Scenario():
    from dtemu.core.scenario import parse_scenario

    return parse_scenario({"name": "tiny", "fl": {"clients": 1, "rounds": 2}})


def test_disabled_dashboard_still_keeps_state():
    with Dashboard(_Scenario(), "tiny", enabled=False) as dash:
        dash.observe(ev(0.0, "client1", "train_start", round=1, samples=8))
    assert dash.state.nodes["client1"].state == TRAINING
    console = Console(record=True, width=120)
    console.print(dash.renderable())
    assert "client1" in console.export_text()


def test_enabled_dashboard_renders_live(capsys):
    with Dashboard(_Scenario(), "tiny live") as dash:
        dash.observe(ev(0.0, "controller", "round_start", round=1, attempt=0))
        dash.observe(ev(0.1, "client1", "upload_start", round=1, bytes=10, steps=1, loss=0.5))
    out = capsys.readouterr().out
    assert "tiny live" in out and "uploading" in out
