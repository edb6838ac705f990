"""The modes, registered in one place: ``MODES[name]`` is the object that says everything the
rest of dtemu asks of a mode (core.modes.base.Mode).  A new mode is a Mode subclass added here.

``FORMS[name]``: a mode that is no longer one, whose scenarios are read as another's: the function
rewrites the scenario's mapping in place and returns notes that say what became what (mode ps, read
as fl: core.fl.ps_form)."""

from __future__ import annotations

from dtemu.core.modes.base import Mode
from dtemu.core.modes.ddp import DataParallel
from dtemu.core.modes.fl import FederatedLearning
from dtemu.core.modes.flower import FlowerApp
from dtemu.core.modes.geo import GeoDistributed
from dtemu.core.fl.ps_form import ps_as_fl

MODES: dict[str, Mode] = {m.name: m for m in (FederatedLearning(), DataParallel(), GeoDistributed(), FlowerApp())}
NAMES = tuple(MODES)
FORMS = {"ps": ps_as_fl}

__all__ = ["FORMS", "MODES", "NAMES", "Mode"]
