"""Every shipped scenario, cut to a few rounds or steps, still ends with its pinned result.

The whole scenarios take 1.5 hours (tests/test_shipped_scenarios.py, slow);
these cuts (tests/pins.py's CUTS) keep each one's roles, codecs and faults and
take about a minute together, so a change that moves a result shows in the
default run.  They run in one fresh interpreter under ``DTEMU_CPU_ARITH=exact``,
whose point is to be the same on every host: one set of pins, no host key.  A
host where a cut ends elsewhere fails, naming itself: either the change moved
the result, or exact is not the same there (a finding about exact, not a reason
to skip; tests/test_fingerprint.py says which).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtemu.host import cpu_arith
from helpers import DATA, needs_mnist
from pins import CUTS, FAST, FAST_ARITH

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fast_results(tmp_path_factory) -> dict:
    """Every cut, in two processes at once (one a core: the results do not depend on it, the run's
    wall time halves), each writing its own JSON."""
    out = tmp_path_factory.mktemp("fast-pins")
    # without the knobs this process's own setting put in its environment (a value set wins)
    env = {k: v for k, v in os.environ.items() if k not in cpu_arith.KNOBS}
    # (two processes of up to two torch threads on two cores: OpenMP's threads must not spin)
    env.update(DTEMU_CPU_ARITH=FAST_ARITH, DTEMU_DATA=DATA, OMP_WAIT_POLICY="PASSIVE")
    names = sorted(CUTS)
    procs = [subprocess.Popen([sys.executable, "-m", "tools.pin_scenarios", "--fast", *names[half::2], "--out",
                               str(out / f"runs{half}"), "--json", str(out / f"fast{half}.json")], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for half in (0, 1)]
    said = [p.communicate(timeout=900)[0] for p in procs]
    results = {}
    for half in (0, 1):
        if not (out / f"fast{half}.json").exists():
            pytest.fail(f"the fast pins did not run:\n{said[half][-3000:]}")
        results.update({r["name"]: r for r in json.loads((out / f"fast{half}.json").read_text())})
    return results


@needs_mnist
@pytest.mark.parametrize("name", sorted(CUTS))
def test_cut_scenario_keeps_its_result(name, fast_results):
    got = fast_results[name]
    platform = got["platform"]
    assert platform["arith"] == FAST_ARITH and platform["fixed"]
    where = (f" on {platform.get('host_class', platform['cpu'])} (fingerprint {platform['fingerprint']}; "
             "`DTEMU_CPU_ARITH=exact python -m tools.pin_scenarios --fast` prints the results)")
    result, pin = got["result"], FAST[name]
    for field, a, b in zip(("model_sha256", "final_accuracy", "rounds or steps", "bytes_up", "bytes_down"),
                           result, pin):
        assert a == b, f"{field}: {a!r}, pinned {b!r}{where}"
    assert result[5] == pytest.approx(pin[5], abs=1e-9), f"time_s: {result[5]!r}, pinned {pin[5]!r}{where}"
