"""geo in real mode (issue 11): the same deterministic FSA scenario over ``real launch`` (one process
per rank, CycloneDDS on loopback) ends with emu's model, bit for bit.  Slow: six processes."""

import subprocess
import sys

import pytest

pytest.importorskip("cyclonedds")

from dtemu.core.scenario import parse_scenario  # noqa: E402
from dtemu.emu.run import run_emulation  # noqa: E402
from dtemu.host.rundir import read_summary  # noqa: E402
from helpers import DATA, ROOT, env, kill_group, needs_mnist, new_domain, scenario_file  # noqa: E402

pytestmark = [needs_mnist, pytest.mark.slow]

GEO = {
    "name": "real_geo", "mode": "geo", "seed": 2, "model": "small_cnn", "threads": 1,
    "data": {"partition": "iid", "test_samples": 300},
    "network": {"sites": {"central": {}, "a": {}, "b": {}}},
    "geo": {"workers_per_site": 1, "rounds": 4, "eval_every": 2, "batch_size": 32,
            "compression": "bisparse_fp16", "round_timeout_s": 30},
}


# the BiSparse blocks (small tensors whole, in fp16) and the JOINs of geo.joining over DDS (issue 11, part 3)
BLOCKS_JOINING = {**GEO, "geo": {**GEO["geo"], "dense_below": 1024, "joining": True}}


# HiPS with dense fp32 pushes, every message sealed under --key-file (issue 26)
HIPS = {**GEO, "geo": {**GEO["geo"], "compression": "none"}}
KEY = "a geo key of at least sixteen bytes"


@pytest.mark.parametrize("scenario, key", [(GEO, None), (BLOCKS_JOINING, None), (HIPS, KEY)],
                         ids=["pairs", "blocks_joining", "hips_sealed"])
def test_real_geo_ends_with_emus_model(tmp_path, monkeypatch, scenario, key):
    monkeypatch.setenv("DTEMU_DATA", DATA)
    path = scenario_file(tmp_path, scenario)
    out = tmp_path / "real"
    args = [sys.executable, "-m", "dtemu.real.cli", "launch", str(path), "--out", str(out), "--no-tui",
            "--timeout", "110", "--threads", "1", "--time-scale", "1", "--domain", str(new_domain())]
    if key:
        (tmp_path / "key").write_text(key)
        args += ["--key-file", str(tmp_path / "key")]
    proc = subprocess.Popen(args, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail("real launch of a geo scenario did not end in 120 s")
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    real = read_summary(out)
    emu = run_emulation(parse_scenario(scenario), tmp_path / "emu", key=key.encode() if key else None)
    assert real["sealed"] == emu["sealed"] == bool(key)
    assert real["stop_reason"] == "done" and real["rounds"] == 4 and real["models_agree"]
    assert real["model_sha256"] == emu["model_sha256"]
    assert real["final_accuracy"] == emu["final_accuracy"]
    assert real["wan_bytes"] == emu["wan_bytes"]   # the same payloads crossed the same (emulated) WAN
