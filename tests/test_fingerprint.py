"""The arithmetic's fingerprint is pinned, and dtemu's training code cannot move it.

The fingerprint (host.arith_fingerprint) tells two arithmetics apart.  It runs a
reference of its own ops, so a change to core.ml that moves every model leaves it
where it was, and the pins fail instead of skipping.  Its value is pinned for each
known host class (tests/pins.py's FINGERPRINTS); under ``exact``, on every host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dtemu.host import cpu_arith
from pins import EXACT, FINGERPRINTS

PROBE = ("import json, dtemu.host\n"
         "from dtemu.host import arith_fingerprint as f, cpu_arith as c\n"
         "print(json.dumps({'class': c.host_class(), 'mode': c.mode(), 'fixed': c.fix()['fixed'],"
         " 'values': {t: f.fingerprint(t) for t in (1, 2)}}))")


def measured(setting: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in cpu_arith.KNOBS}
    env["DTEMU_CPU_ARITH"] = setting
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    got["values"] = {int(t): v for t, v in got["values"].items()}
    return got


def test_exact_has_its_one_fingerprint_on_every_host():
    got = measured("exact")
    if not got["fixed"]:
        pytest.skip("exact cannot be set on this machine (not x86-64 with AVX2)")
    assert got["values"] == FINGERPRINTS[EXACT], (
        f"exact gives another fingerprint on {got['class']}: {got['values']} against {FINGERPRINTS[EXACT]}. "
        "If nothing in host/arith_fingerprint.py changed, exact is not the same here: a finding about exact")


def test_the_default_fingerprint_is_its_host_class_pin():
    got = measured("avx2")
    key = (got["class"], "avx2")
    if key not in FINGERPRINTS:
        pytest.skip(f"no fingerprint pinned for {got['class']}: add {key!r}: {got['values']!r} to tests/pins.py")
    assert got["values"] == FINGERPRINTS[key]


def test_dtemu_training_code_does_not_enter_the_fingerprint(monkeypatch):
    """Break every model dtemu builds and its training loop: the reference is computed all the same."""
    import dtemu.core.ml.models as models
    import dtemu.core.ml.train as train
    from dtemu.host import arith_fingerprint

    def broken(*a, **k):
        raise AssertionError("the fingerprint called dtemu's training code")

    monkeypatch.setattr(models, "build_model", broken)
    monkeypatch.setattr(train, "train_local", broken)
    monkeypatch.setattr(arith_fingerprint, "_cache", {})
    value = arith_fingerprint.fingerprint(1)
    assert len(value) == 12 and int(value, 16) >= 0


def test_a_fingerprint_begun_beside_the_run_is_the_one_computed_in_line(monkeypatch):
    """emu.run starts it in a thread of its own while the run goes on: the same value, and the run's
    thread count and its RNG left as they were."""
    import torch

    from dtemu.host import arith_fingerprint

    monkeypatch.setattr(arith_fingerprint, "_cache", {})
    monkeypatch.setattr(arith_fingerprint, "_running", {})
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    arith_fingerprint.start()
    assert arith_fingerprint.start() is None            # (once: a second start finds it under way)
    begun = arith_fingerprint.fingerprint()
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)
    monkeypatch.setattr(arith_fingerprint, "_cache", {})
    assert begun == arith_fingerprint.fingerprint()
