"""Every shipped scenario ends where it always did: a refactor changes no result.

The pins live in tests/pins.py, keyed by the host class and the arithmetic's
setting (host.cpu_arith): a class whose default arithmetic has no pins skips
these, naming itself, instead of failing on a number another class made.
Slow: the whole set takes about 1.5 hours on 2 cores (the three geo ones 12-13
minutes each), so the default run checks the same scenarios cut short instead
(tests/test_fast_pins.py).  ``python -m tools.pin_scenarios`` prints each
result in the form the pins take.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dtemu.emu.run import run_emulation
from dtemu.host import cpu_arith
from dtemu.host.scenario_file import load_scenario
from helpers import needs_mnist
from pins import CUTS, HOSTS, PINNED

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))


def test_every_shipped_scenario_is_pinned_and_cut():
    for key, pins in PINNED.items():
        assert set(SHIPPED) == set(pins), (key, set(SHIPPED) ^ set(pins))
        assert key in HOSTS  # every set of pins says which host class made it
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
    key = (cpu_arith.host_class(), cpu_arith.mode())
    if key not in PINNED:
        pytest.skip(f"no pins for {key} (pinned: {sorted(PINNED)}); `python -m tools.pin_scenarios` makes them")
    s = run_emulation(scenario, tmp_path / name)
    check(s, scenario.kind.unit, PINNED[key][name])
