"""A "module:function" name, as core.modes names a mode's audit, report page, costs and units
(core names them without importing what runs or reads them), made the function: emu, host and report ask it."""

from __future__ import annotations

import importlib
from functools import cache
from typing import Callable


@cache
def resolve(name: str) -> Callable:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)
