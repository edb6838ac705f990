"""FL for real across network namespaces (three "machines" on one box) against emu.

Opt-in: ``pytest -m slow tests/test_netns.py`` as root (about 1.5 minutes).
Skipped with a reason unless this process may create network namespaces,
veth pairs and tc tbf qdiscs, and MNIST is there.  Everything it creates is
in namespaces of its own on 10.231.0.0/24, with no route out, and is removed
at the end (see tools/netns_fl.py).
"""

import os
import subprocess
from pathlib import Path

import pytest

from helpers import HAVE_MNIST

ROOT = Path(__file__).resolve().parent.parent


def _netns() -> tuple[bool, str]:
    from tools.netns_fl import netns_available

    return netns_available()


pytestmark = pytest.mark.slow


@pytest.fixture
def netns_ok(monkeypatch):
    ok, why = _netns()
    if not ok:
        pytest.skip(f"network namespaces not usable here: {why}")
    if not HAVE_MNIST:
        pytest.skip("MNIST archives not found (set DTEMU_DATA)")
    if not os.environ.get("DTEMU_DATA"):
        monkeypatch.setenv("DTEMU_DATA", str(ROOT.parent / "shared" / "data"))


def _our_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    tag = f"dtfl{os.getpid() % 100000}-"
    return {line.split()[0] for line in out.splitlines() if line.startswith(tag)}


def test_testbed_is_isolated_and_removed(netns_ok):
    from tools.netns_fl import Testbed

    with Testbed(mbps=100) as bed:
        assert _our_namespaces() == set(bed.created)
        for i in range(3):
            # No way out: no default route, only the private subnet.
            p = subprocess.run(bed.exec_prefix(i) + ["ip", "route", "get", "1.1.1.1"], capture_output=True, text=True)
            assert p.returncode != 0
        assert bed.rtt_ms(1, 0) < 50
    assert not _our_namespaces()


def test_two_rounds_real_vs_emu(netns_ok, tmp_path):
    from tools.netns_fl import run

    result = run("scenarios/fl_codecs.yaml", rounds=2, subset=300, out=tmp_path / "netns", timeout_s=400,
                 test_samples=500)
    assert not _our_namespaces()
    assert result["real_summary"]["rounds"] == 2
    assert result["real_summary"]["real"]["exit_codes"][0] == 0
    assert result["emu_summary"]["rounds"] == 2
    replay = result["compare_replay"]
    assert len(replay["rounds"]) == 2
    # Loose bounds: this box is shared (docs/netns.md has the measured numbers).
    assert replay["mean"]["abs_error_pct"] < 30
    assert result["compare"]["mean"]["abs_error_pct"] < 75
    # Emu's model of real mode's transport (headers, the writer's history, decoding) is nearer
    # the real communication time than emu's defaults, which leave them out.
    assert replay["mean"]["abs_comm_error_pct"] < result["compare_replay_payload"]["mean"]["abs_comm_error_pct"]
    assert (tmp_path / "netns" / "netns_fl.md").read_text().count("| mean |") == 3
