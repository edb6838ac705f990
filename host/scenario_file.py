"""Scenario files and the files a scenario names, read for the CLIs.

``load_scenario`` reads a YAML file within the bounds of ``core.bounded_yaml``
(size first, before reading it whole) and hands the mapping to
``core.scenario.parse_scenario``.  ``read_init`` reads the checkpoint that
``fl.init_path`` names and checks it is one this run can resume from, naming
the key and the file when it is not.  Every refusal is a ``ScenarioError``
(the CLIs exit 2), raised before a run folder exists.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from dtemu.core import bounded_yaml
from dtemu.core.errors import CheckpointError, DataError, ScenarioError
from dtemu.core.ml import user_code
from dtemu.host import devices
from dtemu.host import profile as profiles
from dtemu.core.scenario import Scenario, apply_override, parse_scenario
from dtemu.core.wire.checkpoint import decode_checkpoint


def _cleared(raw: dict, costs: list[str], overrides: list[str]) -> list[str]:
    """The profile's costs that an override took away by replacing a mapping above them, again: ``--set
    compute.nodes={worker2: {slowdown: 4}}`` replaces the nodes' mapping, and with it the profile's
    ``compute.nodes.ps.decode_s_per_mb``, which the user did not mean to set.  A cost the user set
    itself, at its key or inside a mapping that names it, stays the user's."""
    merged = copy.deepcopy(raw)
    for assignment in [*costs, *overrides]:
        apply_override(merged, assignment)
    return [c for c in costs if not _has(merged, c.split("=", 1)[0].split("."))]


def _has(node, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def load_scenario(path: str | Path, overrides: list[str] = (), *, allow_code: bool = True,
                  profile: str | Path | None = None) -> Scenario:
    """The scenario at ``path`` with ``overrides``; ``allow_code=False`` (``--no-code``) refuses one
    that names code (core.ml.user_code).  A calibration profile (``profile``, else the scenario's
    ``compute.profile``) sets its costs first, then ``overrides`` (host.profile)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > bounded_yaml.MAX_BYTES:
            raise ScenarioError("", f"{path} is {size:,} bytes; a scenario may have at most "
                                    f"{bounded_yaml.MAX_BYTES:,}")
        raw = path.read_bytes()
    except OSError as err:
        raise ScenarioError("", f"cannot read scenario {path}: {err.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ScenarioError("", f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    raw = _paths_from_file(bounded_yaml.load(text, str(path)), path)
    notes: list[str] = []   # what reading an older form (mode ps) changed
    scenario = parse_scenario(raw, overrides, notes)
    if profile is not None or scenario.compute.profile:
        where = Path(profile).resolve() if profile is not None else profiles.resolve(scenario.compute.profile, path)
        costs = profiles.assignments(profiles.read_profile(where))
        again = _cleared(raw, costs, overrides)
        notes.clear()
        scenario = parse_scenario(raw, [*costs, *overrides, *again, f"{profiles.KEY}={where}"], notes)
    for note in notes:
        print(f"{path}: note: {note}", file=sys.stderr)
    devices.resolve(scenario)  # a GPU it cannot have: refused now, not run on the CPU
    if not allow_code:
        refuse_code(scenario)
    return scenario


# Keys that name a folder relative to the scenario file that holds them (a --set names one from here).
FILE_RELATIVE = (("flower", "app_dir"),)


def _paths_from_file(raw, path: Path):
    """``raw`` with the FILE_RELATIVE keys it holds made absolute against ``path``'s folder, so that
    the scenario runs from any working directory."""
    for section, key in FILE_RELATIVE:
        block = raw.get(section) if isinstance(raw, dict) else None
        value = block.get(key) if isinstance(block, dict) else None
        if isinstance(value, str) and value and not Path(value).is_absolute():
            block[key] = str((path.parent / value).resolve())
    return raw


def read_init(scenario: Scenario, resuming_a_crash: bool = False) -> bytes | None:
    """The checkpoint ``fl.init_path`` names (None if none), checked before anything starts.

    A checkpoint of the last round has nothing left to run: refused, unless this is a
    controller that ``real launch`` restarts after a crash (``resuming_a_crash``), which
    then just finishes the run."""
    path = scenario.fl.init_path
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ScenarioError("fl.init_path", f"cannot read checkpoint {path}: {err.strerror}") from None
    try:
        ckpt = decode_checkpoint(data)
    except CheckpointError as err:
        raise ScenarioError("fl.init_path", f"{path}: {err}") from None
    if ckpt.round >= scenario.fl.rounds and not resuming_a_crash:
        raise ScenarioError("fl.init_path", f"{path} is the checkpoint of round {ckpt.round}, and fl.rounds is "
                                            f"{scenario.fl.rounds}: nothing is left to run; to go on, raise "
                                            f"fl.rounds (e.g. --set fl.rounds={ckpt.round + 10})")
    return data


def check_code(scenario: Scenario) -> None:
    """Run the code the scenario names once, so that a factory that fails, exits, or returns the
    wrong thing is a ScenarioError naming its key before anything starts: the model is built,
    and a data factory called (its data set is kept for the run: host.datasets caches it)."""
    if not scenario.kind.own_model:  # (a Flower app): loading its code is its check
        from dtemu.host.work import load_work

        load_work(scenario)
        return
    from dtemu.core.ml.models import build_model  # torch: only when a run is about to start

    build_model(scenario.model_spec, seed=scenario.seed)
    if scenario.task:
        from dtemu.host.datasets import load_task_data

        try:
            load_task_data(scenario.task)
        except DataError as err:  # what its data() returned is no data set
            raise ScenarioError("task", str(err)) from None
    if scenario.data.factory:
        from dtemu.host.datasets import load_dataset_factory

        try:
            load_dataset_factory(scenario.data.factory)
        except DataError as err:  # what it returned is no data set: the scenario's error too
            raise ScenarioError("data.factory", str(err)) from None


def code_keys(scenario: Scenario) -> dict[str, str]:
    """Every key of the scenario that names code, with what it names."""
    keys = {"task": scenario.task, "model": scenario.model, "data.factory": scenario.data.factory}
    named = {key: spec for key, spec in keys.items() if user_code.names_code(spec)}
    return {**named, **scenario.kind.code_keys(scenario)}


def refuse_code(scenario: Scenario) -> None:
    """``--no-code``: refuse a scenario that names code, before any of it is imported."""
    for key, spec in code_keys(scenario).items():
        raise ScenarioError(key, f"{spec!r} names code ({user_code.FORM}), and --no-code refuses scenarios that "
                                 "run code; use a registered name, or drop --no-code for a file you trust")
