"""The modes, registered in one place: ``MODES[name]`` is the object that says everything the
rest of dtemu asks of a mode (core.modes.base.Mode).  A new mode is a Mode subclass added here."""

from __future__ import annotations

from dtemu.core.modes.base import Mode
from dtemu.core.modes.ddp import DataParallel
from dtemu.core.modes.fl import FederatedLearning
from dtemu.core.modes.flower import FlowerApp
from dtemu.core.modes.geo import GeoDistributed
from dtemu.core.modes.ps import ParameterServer

MODES: dict[str, Mode] = {m.name: m for m in (FederatedLearning(), DataParallel(), ParameterServer(),
                                              GeoDistributed(), FlowerApp())}
NAMES = tuple(MODES)

__all__ = ["MODES", "NAMES", "Mode"]
