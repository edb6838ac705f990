"""The CPU arithmetic a run trains with, fixed before torch and numpy load.

torch picks its CPU kernels when it loads, for the widest vector unit the host
has: ATen's own kernels (``ATEN_CPU_CAPABILITY``), oneDNN's convolutions
(``ONEDNN_MAX_CPU_ISA``) and MKL's matrix products (``MKL_CBWR``).  Each width
sums in its own order, and MKL and oneDNN also choose by vendor and cache size,
so the same scenario and seed can end with another ``model_sha256`` on another
host.  ``DTEMU_CPU_ARITH`` picks one of three settings (measured in
docs/notebook/2026-11-23-07-one-driver-one-package-the-layout-of-issue-9.md, "The same model on any x86-64 host"):

- ``avx2`` (the default; ``portable`` is its old name): all three capped at
  AVX2.  Fast (within 2% of native at 2 threads on an AVX-512 AMD EPYC), and the
  same model on hosts of one class, but **not** across vendors: an Intel Xeon and
  an AMD EPYC train different models.
- ``exact``: every library at its most portable: ATen's default kernels,
  oneDNN's SSE4.1 ones, MKL's COMPATIBLE branch, numpy's baseline loops and
  OpenBLAS's Nehalem kernels.  The probe trains the same model on an Intel Xeon
  (AVX-512, AMX) and an AMD EPYC (AVX-512); it costs 1.9-2.4x the training time.
  The fast pins of the default test run use it.
- ``native``: the libraries choose (fastest; results tied to the host).

A value the user set for one of the libraries wins (``os.environ.setdefault``).
On another architecture (arm64) nothing is set: its kernels differ anyway.
Every summary records what was in force (``describe``), with the arithmetic's
fingerprint (host.arith_fingerprint): runs with the same fingerprint train the
same model, which is what the pins are keyed by.

The packages that load torch (``dtemu.emu``, ``dtemu.real``, ``dtemu.host``,
``tools``) call ``fix`` from their ``__init__``; a program that imported torch
before dtemu is told so in ``describe()["fixed"]``.
"""

from __future__ import annotations

import os
import platform
import sys

SWITCH = "DTEMU_CPU_ARITH"  # "avx2" (default), "exact" or "native"
DEFAULT = "avx2"
ALIASES = {"portable": "avx2"}  # the default's name before "exact" existed
SETTINGS = {
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "DNNL_MAX_CPU_ISA": "AVX2",  # oneDNN's older name for the same cap
        "MKL_CBWR": "AVX2",
    },
    "exact": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "DNNL_MAX_CPU_ISA": "SSE41",
        "MKL_CBWR": "COMPATIBLE",
        # numpy's loops at its x86-64-v2 baseline (numpy >= 2.4 names its dispatch targets so),
        # and OpenBLAS's (np.dot) kernels for SSE4.2, so that no reduction depends on the host
        "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
        "OPENBLAS_CORETYPE": "Nehalem",
    },
}
MODES = (*SETTINGS, "native")
PORTABLE = SETTINGS[DEFAULT]
KNOBS = sorted({k for env in SETTINGS.values() for k in env})  # every variable a setting may set
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


def mode() -> str:
    """The setting ``DTEMU_CPU_ARITH`` asks for; a typo counts as the default (never silently native)."""
    asked = os.environ.get(SWITCH, DEFAULT).strip().lower() or DEFAULT
    asked = ALIASES.get(asked, asked)
    return asked if asked in MODES else DEFAULT


def fix() -> dict:
    """Apply the chosen setting; idempotent, effective only before torch (and numpy) load."""
    global _state
    if _state is not None:
        return _state
    chosen = mode()
    loaded = "torch" in sys.modules or (chosen == "exact" and "numpy" in sys.modules)
    applies = chosen != "native" and platform.machine().lower() in _X86 and _has_avx2() is not False
    if applies and not loaded:
        for key, value in SETTINGS[chosen].items():
            os.environ.setdefault(key, value)
    _state = {"mode": chosen, "fixed": applies and not loaded, "torch_loaded_first": loaded}
    return _state


def describe() -> dict:
    """What the run's arithmetic was: the library versions and the kernels in force (summary.json's ``platform``)."""
    import numpy
    import torch

    from dtemu.host import arith_fingerprint

    state = fix()
    return {
        "cpu": cpu_model(),
        "host_class": host_class(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_isa": os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA"),
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "numpy_simd": _numpy_simd(),
        "arith": state["mode"],
        "fixed": state["fixed"],
        "threads": torch.get_num_threads(),
        "fingerprint": arith_fingerprint.fingerprint(),
    }


def _numpy_simd() -> list[str] | None:
    """numpy's dispatch targets in force on this host (None where this numpy does not say)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:
        return None
    return [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]


def _cpuinfo() -> dict[str, str] | None:
    """/proc/cpuinfo's first processor, by key (None where there is none)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return None
    return info


def cpu_model() -> str:
    """The host's CPU as /proc/cpuinfo names it (model name, family and model), else the platform's."""
    info = _cpuinfo()
    if info is None:
        return platform.processor() or "unknown"
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"


def host_class() -> str:
    """The class of CPU whose default arithmetic is one: vendor, family and model (tests/pins.py keys
    the fingerprint's value by it), e.g. ``GenuineIntel family 6 model 207``."""
    info = _cpuinfo()
    if info is None:
        return f"{platform.machine()} {platform.processor() or 'unknown'}"
    return f"{info.get('vendor_id', '?')} family {info.get('cpu family', '?')} model {info.get('model', '?')}"
