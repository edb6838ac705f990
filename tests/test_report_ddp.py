"""The data-parallel report on synthetic run folders: figures written, table numbers right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtemu.report import report

KEYS = ("bytes_sent", "bytes_received", "compute_s", "compress_s", "send_s", "wait_s", "comm_s")
DGC_SCHEDULE = [0.25, 0.25, 0.0625, 0.0625, 0.001, 0.001, 0.001, 0.001]
DGC_BYTES = {0.25: 500, 0.0625: 200, 0.001: 10}


def write_ddp_run(folder: Path, *, compression: str, mbps: float = 1000, workers: int = 2,
                  steps: int = 8, steps_per_epoch: int = 4, window: int = 4,
                  density=None, bytes_sent=None, comm_s=None, windows: bool = True,
                  accuracy=(0.9, 0.95), runtime: str = "emu") -> Path:
    """A finished DDP run: every worker emits every step; ``bytes_sent(step, rank)`` etc."""
    density = density or (lambda s: 1.0)
    bytes_sent = bytes_sent or (lambda s, r: 1000 + 200 * r)
    comm_s = comm_s or (lambda s, r: 0.01 * (1 + s % 2) + 0.001 * r)
    names = [f"worker{r}" for r in range(workers)]
    events, t = [], 0.0

    def ev(node, kind, **fields):
        events.append({"t": round(t, 6), "node": node, "kind": kind, **fields})

    for r, name in enumerate(names):
        ev(name, "node_up")
        ev(name, "worker_start", rank=r, world=workers, dim=1000, steps_per_epoch=steps_per_epoch,
           compression=compression)
    rows = {name: [] for name in names}
    for step in range(steps):
        epoch = step // steps_per_epoch
        t += 0.05
        for r, name in enumerate(names):
            c = comm_s(step, r)
            row = {"step": step, "bytes_sent": bytes_sent(step, r), "bytes_received": bytes_sent(step, 1 - r),
                   "compute_s": 0.04, "compress_s": 0.002 if compression == "dgc" else 0.0,
                   "send_s": c / 2, "wait_s": c / 2, "comm_s": c}
            ev(name, "step", epoch=epoch, loss=1.0 / (step + 1), density=density(step), **row)
            rows[name].append(row)
            if windows and len(rows[name]) == window:
                summary = {"steps": window, "first_step": rows[name][0]["step"]}
                for key in KEYS:
                    values = [x[key] for x in rows[name]]
                    summary[f"{key}_mean"] = sum(values) / len(values)
                    summary[f"{key}_max"] = max(values)
                ev(name, "window", epoch=epoch, **summary)
                rows[name] = []
        if (step + 1) % steps_per_epoch == 0:
            for name in names:
                ev(name, "eval", epoch=epoch, step=step + 1, accuracy=accuracy[epoch])
    for name in names:
        ev(name, "worker_end", steps=steps, model_sha256="ab", bytes_sent=0, bytes_received=0, counts={})
    total = sum(bytes_sent(s, r) for s in range(steps) for r in range(workers))
    summary = {
        "scenario": f"ddp_{compression}", "runtime": runtime, "mode": "ddp", "compression": compression,
        "workers": workers, "seed": 1, "final_accuracy": accuracy[-1], "steps": steps,
        "bytes_up": total, "bytes_down": total, "wire_bytes": total,
        "bytes_per_step": total / steps / workers, "model_sha256": "ab", "models_agree": True,
        "time_s": t, "wall_time_s": 2.0,
    }
    scenario = {"name": f"ddp_{compression}", "mode": "ddp", "seed": 1, "model": "mnist_cnn",
                "ddp": {"workers": workers, "compression": compression, "window": window},
                "network": {"default": {"up_mbps": mbps, "down_mbps": mbps, "latency_ms": 0.1, "loss": 0.0},
                            "nodes": {}, "mtu": 1500}}
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "scenario.json").write_text(json.dumps(scenario))
    return folder


def dgc_run(folder: Path, **kwargs) -> Path:
    return write_ddp_run(folder, compression="dgc", density=lambda s: DGC_SCHEDULE[s],
                         bytes_sent=lambda s, r: DGC_BYTES[DGC_SCHEDULE[s]] + 2 * r,
                         comm_s=lambda s, r: 0.001 * (s + 1) + 0.0005 * r, **kwargs)


@pytest.fixture
def runs(tmp_path):
    return [write_ddp_run(tmp_path / "ddp_baseline", compression="none"),
            dgc_run(tmp_path / "ddp_dgc"),
            dgc_run(tmp_path / "ddp_dgc_100", mbps=100)]


def test_table_numbers(runs):
    rows = {row["label"]: row for row in report.ddp_table([report.load_run(p) for p in runs])}
    assert set(rows) == {"none 1Gb", "dgc 1Gb", "dgc 100Mb"}
    base, dgc, slow = rows["none 1Gb"], rows["dgc 1Gb"], rows["dgc 100Mb"]
    # dense: no warm-up, workers send 1000 and 1200 bytes per step
    assert base["bytes_per_step_warmup"] is None
    assert base["bytes_per_step_after"] == pytest.approx(1100)
    assert base["vs_dense"] == pytest.approx(1.0)
    assert base["warmup_steps"] is None and base["final_density"] == 1.0
    # DGC: steps 0-3 are warm-up (500/502, 200/202 bytes), steps 4-7 after (10/12 bytes)
    assert dgc["final_density"] == 0.001 and dgc["warmup_steps"] == 4
    assert dgc["bytes_per_step_warmup"] == pytest.approx((500 + 502 + 200 + 202) / 4)
    assert dgc["bytes_per_step_after"] == pytest.approx(11)
    assert dgc["vs_dense"] == pytest.approx(11 / 1100)
    # the 100 Mbit/s run has no dense run of its own: it is compared with the only one
    assert slow["vs_dense"] == pytest.approx(11 / 1100)
    # comm time after warm-up: steps 4..7, comm = 0.001 (s+1) + 0.0005 r
    comm = [0.001 * (s + 1) + 0.0005 * r for s in range(4, 8) for r in range(2)]
    assert dgc["comm_s_mean"] == pytest.approx(sum(comm) / len(comm))
    assert dgc["comm_s_max"] == pytest.approx(max(comm))
    assert dgc["compress_s_mean"] == pytest.approx(0.002)
    assert base["compress_s_mean"] == 0.0
    assert dgc["final_accuracy"] == 0.95 and dgc["workers"] == 2 and dgc["steps"] == 8


def test_main_writes_figures_and_markdown(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert report.main([str(p) for p in runs] + ["--out", str(out)]) == 0
    for name in ("ddp_bytes.png", "ddp_accuracy.png", "ddp_comm_time.png", "ddp.md"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "ddp.md").read_text()
    lines = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "| 1,100 | 1.0000 |" in lines["none 1Gb"]
    assert "| 351 | 11 | 0.0100 |" in lines["dgc 1Gb"]
    assert lines["none 1Gb"].split(" | ")[5] == "–"  # no warm-up in a dense run
    assert "| 0.9500 |" in lines["dgc 100Mb"]
    printed = capsys.readouterr().out
    assert "ddp_comm_time.png" in printed and "dgc 100Mb" in printed


def test_labels_without_a_network_difference(tmp_path):
    runs = [report.load_run(write_ddp_run(tmp_path / "a", compression="none")),
            report.load_run(dgc_run(tmp_path / "b"))]
    assert report.ddp_labels(runs) == ["none", "dgc"]
    # two runs of the same kind are told apart by their folders
    twin = report.load_run(dgc_run(tmp_path / "c"))
    assert report.ddp_labels(runs + [twin]) == ["none [a]", "dgc [b]", "dgc [c]"]


def test_curves_and_windows(tmp_path):
    run = report.load_run(dgc_run(tmp_path / "dgc"))
    assert report.ddp_bytes_curve(run) == [(s, DGC_BYTES[d] + 1) for s, d in enumerate(DGC_SCHEDULE)]
    assert report.ddp_accuracy_curve(run) == [(0, 0.9), (1, 0.95)]
    windows = report.ddp_comm_windows(run)
    assert [(w.first_step, w.steps) for w in windows] == [(0, 4), (4, 4)]
    # window 2: steps 4..7; mean over both workers, max = the slowest worker's slowest step
    assert windows[1].mean == pytest.approx(0.001 * 6.5 + 0.00025)
    assert windows[1].max == pytest.approx(0.008 + 0.0005)
    # without window events: one window per step, from the step events
    bare = report.load_run(dgc_run(tmp_path / "bare", windows=False))
    per_step = report.ddp_comm_windows(bare)
    assert len(per_step) == 8 and per_step[0].max == pytest.approx(0.0015)


def test_fl_and_ddp_runs_together(runs, tmp_path):
    from test_dashboard_report import write_run  # the FL run writer

    fl = write_run(tmp_path / "fl", codec="fp32", update_bytes=4000, round_s=[1.0, 1.0])
    out = tmp_path / "both"
    assert report.main([str(fl), str(runs[0]), str(runs[1]), "--out", str(out)]) == 0
    assert (out / "report.md").exists() and (out / "ddp.md").exists()
    assert "ddp" in report.REPORTS and "fl" in report.REPORTS
