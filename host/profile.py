"""Calibration profiles: what a scenario's roles cost on one machine (``emu calibrate`` writes them).

A profile is a YAML file::

    format: 1
    machine: {cpu: ..., cores: 2, arith: avx2, fingerprint: ..., torch: ..., date: ...}
    measured: {scenario: fl_codecs, mode: fl, model: mnist_cnn, batch_size: 64, threads: 1, ...}
    sets:                                   # scenario keys, applied as --set would
      compute.default.train_s_per_sample: 6.9e-04
      compute.default.decode_s_per_mb: 1.2e-03
      network.framing: rtps
      ...

A scenario names one (``compute.profile: FILE``, relative to the scenario's
folder) or ``emu run --profile FILE`` applies it: its ``sets`` go first, then
the scenario's own ``--set`` (which win).  A profile may set only ``compute.*``
and ``network.framing`` / ``network.send_window_bytes``: it describes a machine,
never the training.  Measured on one machine, it predicts runs on machines of
that kind (``machine`` says which).
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

from dtemu.core import bounded_yaml
from dtemu.core.errors import ScenarioError

FORMAT = 1
KEY = "compute.profile"
ALLOWED = ("compute.", "network.framing", "network.send_window_bytes")


def read_profile(path: str | Path) -> dict:
    """The profile at ``path``, checked; a ScenarioError at ``compute.profile`` otherwise."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ScenarioError(KEY, f"cannot read profile {path}: {err.strerror}") from None
    if len(raw) > bounded_yaml.MAX_BYTES:
        raise ScenarioError(KEY, f"{path} is {len(raw):,} bytes; a profile may have at most {bounded_yaml.MAX_BYTES:,}")
    try:
        profile = bounded_yaml.load(raw.decode("utf-8"), str(path))
    except UnicodeDecodeError:
        raise ScenarioError(KEY, f"{path} is not UTF-8 text") from None
    if not isinstance(profile, dict) or profile.get("format") != FORMAT or not isinstance(profile.get("sets"), dict):
        raise ScenarioError(KEY, f"{path} is not a dtemu profile (format {FORMAT}, with a 'sets' mapping): "
                                 "emu calibrate writes them")
    for key, value in profile["sets"].items():
        if not isinstance(key, str) or not key.startswith(ALLOWED):
            raise ScenarioError(KEY, f"{path}: a profile sets only the machine's costs ({', '.join(ALLOWED)}*), "
                                     f"not {key!r}")
        if isinstance(value, dict) or isinstance(value, list) and not all(_number(v) for v in value):
            raise ScenarioError(KEY, f"{path}: {key} must be a single value or a list of numbers (a warm-up's steps)")
    return profile


def assignments(profile: dict) -> list[str]:
    """The profile's ``sets`` as ``--set`` assignments (values written as YAML reads them back)."""
    return [f"{key}={_yaml_scalar(value)}" for key, value in profile["sets"].items()]


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _yaml_scalar(value) -> str:
    if isinstance(value, list):
        return f"[{', '.join(_yaml_scalar(v) for v in value)}]"
    if isinstance(value, float):
        return f"{value:.6e}"  # YAML reads 9e-05 as a string, 9.000000e-05 as a number
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def resolve(spec: str, scenario_file: Path | None) -> Path:
    """A profile path from a scenario: relative to the scenario's folder."""
    path = Path(spec).expanduser()
    if not path.is_absolute() and scenario_file is not None:
        path = scenario_file.parent / path
    return path.resolve()


def machine() -> dict:
    """The machine a profile is measured on: what predicts whether it holds on another."""
    from dtemu.host import cores, cpu_arith

    arith = cpu_arith.describe()
    return {"cpu": cpu_arith.cpu_model(), "cores": cores.available(), "machine": platform.machine(),
            "arith": arith["arith"], "fingerprint": arith["fingerprint"], "torch": str(arith["torch"]),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
