"""The CPU arithmetic a run trains with, fixed so that a seed gives one model on any x86-64 host.

torch picks its CPU kernels when it loads, for the widest vector unit the host
has: ATen's own kernels (``ATEN_CPU_CAPABILITY``), oneDNN's convolutions
(``ONEDNN_MAX_CPU_ISA``) and MKL's matrix products (``MKL_CBWR``).  Each width
sums in its own order, so the same scenario and seed end with another
``model_sha256`` on an AVX-512 host than on an AVX2 one, and a pinned result
cannot be checked on a new machine (measured: each of the three moves the model
on its own; docs/results.md, "The same model on any x86-64 host").

Before torch loads, dtemu caps all three at AVX2, which every x86-64 server of
the last decade has, and asks MKL for its reproducible mode on that branch.  A
value the user set wins (``os.environ.setdefault``); ``DTEMU_CPU_ARITH=native``
leaves the libraries to choose (faster on AVX-512 hosts, results tied to the
host).  On another architecture (arm64) nothing is set: its kernels differ
anyway.  Every summary records what was in force (``describe``), so a pin that
fails names the arithmetic it ran with.

The packages that load torch (``dtemu.emu``, ``dtemu.real``, ``dtemu.host``,
``tools``) call ``fix`` from their ``__init__``; a program that imported torch
before dtemu is told so in ``describe()["fixed"]``.
"""

from __future__ import annotations

import os
import platform
import sys

SWITCH = "DTEMU_CPU_ARITH"  # "portable" (default) or "native"
PORTABLE = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",  # oneDNN's older name for the same cap
    "MKL_CBWR": "AVX2",
}
_X86 = {"x86_64", "amd64", "x64"}
_state: dict | None = None  # what the first call found and did


def _has_avx2() -> bool | None:
    """True or False from /proc/cpuinfo; None where it cannot be read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx2" in line.split()
    except OSError:
        return None
    return None


def fix() -> dict:
    """Cap torch's CPU kernels at AVX2 unless told otherwise; idempotent, effective only before torch loads."""
    global _state
    if _state is not None:
        return _state
    mode = os.environ.get(SWITCH, "portable").strip().lower() or "portable"
    if mode not in ("portable", "native"):
        mode = "portable"  # a typo must not silently give host-tied results: it counts as the default
    loaded = "torch" in sys.modules
    applies = mode == "portable" and platform.machine().lower() in _X86 and _has_avx2() is not False
    if applies and not loaded:
        for key, value in PORTABLE.items():
            os.environ.setdefault(key, value)
    _state = {"mode": mode, "fixed": applies and not loaded, "torch_loaded_first": loaded}
    return _state


def describe() -> dict:
    """What the run's arithmetic was: the library versions and the kernels in force (summary.json's ``platform``)."""
    import numpy
    import torch

    state = fix()
    return {
        "machine": platform.machine(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "arith": state["mode"],
        "fixed": state["fixed"],
    }
