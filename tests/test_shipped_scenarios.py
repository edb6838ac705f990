"""Every shipped scenario ends where it always did: a refactor changes no result.

The pins live in tests/pins.py, keyed by the arithmetic's fingerprint
(host.arith_fingerprint): a host whose arithmetic has no pins skips these,
naming its fingerprint, instead of failing on a number another host made.
Slow: the whole set takes about 1.5 hours on 2 cores (the three geo ones 12-13
minutes each), so the default run checks the same scenarios cut short instead
(tests/test_fast_pins.py).  ``python -m tools.pin_scenarios`` prints each
result in the form the pins take.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dtemu.emu.run import run_emulation
from dtemu.host.arith_fingerprint import fingerprint
from dtemu.host.scenario_file import load_scenario
from helpers import needs_mnist
from pins import CUTS, HOSTS, PINNED

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))


def test_every_shipped_scenario_is_pinned_and_cut():
    for fp, pins in PINNED.items():
        assert set(SHIPPED) == set(pins), (fp, set(SHIPPED) ^ set(pins))
        assert fp in HOSTS  # every set of pins says which host class made it
    assert set(SHIPPED) == set(CUTS), set(SHIPPED) ^ set(CUTS)


def check(summary: dict, unit: str, pin: tuple) -> None:
    sha, accuracy, progress, up, down, time_s = pin
    assert summary["model_sha256"] == sha
    assert summary["final_accuracy"] == accuracy
    assert summary[unit + "s"] == progress
    assert (summary["bytes_up"], summary["bytes_down"]) == (up, down)
    assert summary["time_s"] == pytest.approx(time_s, abs=1e-9)


@pytest.mark.slow
@needs_mnist
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenario_keeps_its_result(name, tmp_path):
    scenario = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    fp = fingerprint(scenario.threads)
    if fp not in PINNED:
        pytest.skip(f"no pins for this host's arithmetic (fingerprint {fp}; pinned: {HOSTS}); "
                    "`python -m tools.pin_scenarios` makes them")
    s = run_emulation(scenario, tmp_path / name)
    assert s["platform"]["fingerprint"] == fp
    check(s, scenario.kind.unit, PINNED[fp][name])
