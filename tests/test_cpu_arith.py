"""torch's CPU kernels are fixed before torch loads, so a seed gives one model on any x86-64 host.

Each check runs in a fresh interpreter: which kernels torch uses is decided once,
when it loads.  What the run used is recorded in summary.json's ``platform``.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

from dtemu.host import cpu_arith
from dtemu.host.rundir import read_summary
from helpers import needs_mnist

KNOBS = (*cpu_arith.KNOBS, cpu_arith.SWITCH)
x86_avx2 = pytest.mark.skipif(platform.machine().lower() not in cpu_arith._X86 or cpu_arith._has_avx2() is False,
                              reason="the portable kernels are AVX2's: an x86-64 host with AVX2")

PROBE = """
import json, os, sys
{first}
import torch
from dtemu.host import cpu_arith
print(json.dumps({{"capability": torch.backends.cpu.get_cpu_capability(),
                   "env": {{k: os.environ.get(k) for k in cpu_arith.KNOBS if os.environ.get(k) is not None}},
                   "describe": cpu_arith.describe()}}))
"""


def probe(first: str, **env) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in KNOBS}
    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@x86_avx2
@pytest.mark.parametrize("first", ["import dtemu.host", *(pytest.param(f, marks=pytest.mark.slow)  # (a probe each: 2.5 s)
                                                      for f in ("import dtemu.emu.run", "import dtemu.real.cli"))])
def test_loading_dtemu_caps_every_library_at_avx2(first):
    got = probe(first)
    assert got["capability"] == "AVX2"
    assert got["env"] == cpu_arith.PORTABLE
    assert got["describe"]["fixed"] is True and got["describe"]["mkl_cbwr"] == "AVX2"


@x86_avx2
def test_a_value_the_user_set_wins():
    got = probe("import dtemu.emu.run", ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE")
    assert got["capability"] == "DEFAULT"
    assert got["env"]["MKL_CBWR"] == "COMPATIBLE" and got["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"


def test_native_leaves_the_libraries_to_choose():
    got = probe("import dtemu.emu.run", DTEMU_CPU_ARITH="native")
    assert got["env"] == {}
    assert got["describe"]["arith"] == "native" and got["describe"]["fixed"] is False


@x86_avx2
def test_exact_sets_every_library_at_its_most_portable():
    got = probe("import dtemu.emu.run", DTEMU_CPU_ARITH="exact")
    assert got["capability"] == "DEFAULT"
    assert got["env"] == cpu_arith.SETTINGS["exact"]
    assert got["describe"]["arith"] == "exact" and got["describe"]["numpy_simd"] in ([], None)


@x86_avx2
@pytest.mark.parametrize("asked", ["no-such-setting", *(pytest.param(a, marks=pytest.mark.slow) for a in ("portable", "AVX2"))])
def test_the_old_name_and_a_typo_both_mean_the_default(asked):
    got = probe("import dtemu.emu.run", DTEMU_CPU_ARITH=asked)
    assert got["env"] == cpu_arith.PORTABLE and got["describe"]["arith"] == "avx2"


@x86_avx2
def test_the_fingerprint_tells_the_settings_apart_and_not_the_runs():
    runs = {m: probe("import dtemu.emu.run", DTEMU_CPU_ARITH=m)["describe"]["fingerprint"] for m in ("avx2", "exact")}
    assert runs["avx2"] != runs["exact"]
    assert probe("import dtemu.host", DTEMU_CPU_ARITH="exact")["describe"]["fingerprint"] == runs["exact"]


def test_torch_loaded_before_dtemu_is_said_not_hidden():
    got = probe("import torch; import dtemu.emu.run")
    assert got["describe"]["fixed"] is False
    assert got["env"] == {}  # setting them now would change nothing


@needs_mnist
def test_the_summary_names_the_arithmetic(tmp_path, monkeypatch):
    from helpers import DATA
    from dtemu.core.scenario import parse_scenario
    from dtemu.emu.run import run_emulation

    monkeypatch.setenv("DTEMU_DATA", DATA)
    scenario = parse_scenario({"name": "arith", "seed": 1, "model": "small_cnn", "data": {"test_samples": 200},
                               "fl": {"clients": 2, "rounds": 1, "subset": 64, "batch_size": 32}}, [])
    run_emulation(scenario, tmp_path / "run")
    got = read_summary(tmp_path / "run")["platform"]
    assert got == cpu_arith.describe()
    assert set(got) >= {"torch", "numpy", "cpu_capability", "onednn_max_isa", "mkl_cbwr", "fixed", "fingerprint"}
