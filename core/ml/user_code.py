"""Code a scenario names (``model`` or ``data.factory`` as ``package.module:factory``).

A scenario that names code is code: loading it imports a module and calls a
function, with this process's rights.  So, for files from elsewhere, a CLI's
``--no-code`` refuses every such key before anything is imported
(host.scenario_file.refuse_code).  When code is allowed, whatever it does wrong, on import or
when called, is a ``ScenarioError`` naming its key (the CLIs exit 2): an
exception, and also ``SystemExit`` or ``KeyboardInterrupt`` raised by the user's
code (``sys:exit`` as a model used to end ``emu run`` with status 0 and no word).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from dtemu.core.errors import ScenarioError

FORM = "package.module:factory"
TASK_PREFIX = "task:"  # a task's model travels as this + the task's spec (core.ml.task)
# Built-in tasks by name (``task: char_lm``): dtemu's own code, so --no-code lets them through
BUILTIN_TASKS = {
    "cifar10_resnet18": "dtemu.host.tasks:Cifar10ResNet18",
    "char_lm": "dtemu.core.ml.charlm:CharLM",
}


def names_code(spec: str | None) -> bool:
    """Is this a ``package.module:factory`` spec (rather than a registered name)?"""
    return bool(spec) and ":" in spec


def model_spec(task: str | None, model: str) -> str:
    """The model spec a scenario's roles build: its task's, or its ``model`` key."""
    return TASK_PREFIX + task if task else model


def is_task(spec: str) -> bool:
    return spec.startswith(TASK_PREFIX)


def load(key: str, spec: str, what: str) -> Callable[[], Any]:
    """The function ``spec`` names; any failure to import it is a ScenarioError at ``key``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ScenarioError(key, f"{what} {spec!r} is not of the form {FORM}")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except BaseException as err:  # the module may raise anything at import, SystemExit included
        raise ScenarioError(key, f"{what} {spec!r} cannot be imported: {type(err).__name__}: {err}") from None
    if not callable(fn):
        raise ScenarioError(key, f"{what} {spec!r} is a {type(fn).__name__}, not a function")
    return fn


def call(key: str, spec: str, what: str, fn: Callable[[], Any]) -> Any:
    """``fn()``; anything it raises (SystemExit, KeyboardInterrupt too) is a ScenarioError at ``key``."""
    try:
        return fn()
    except BaseException as err:  # the user's code: exiting or interrupting is its failure, not ours
        raise ScenarioError(key, f"{what} {spec!r} failed: {type(err).__name__}: {err}") from None
