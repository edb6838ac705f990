"""Error-feedback residuals of many clients, at most a bound of them in memory.

With ``fl.error_feedback`` every client that trained keeps what its lossy codec
did not send (one model-sized vector).  A thousand clients of a large model
would hold a thousand of them; ``fl.residuals_in_memory`` bounds how many stay
in memory (the most recently used), and the rest go to a *spill*: a mapping the
runtime supplies (emu: ``host.spill.DiskSpill``, files in the run folder), so
core does no I/O.  A client's residual is created when it first trains, taken
when it trains again, and forgotten when the client crashes (it lived on the
client).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import MutableMapping

import numpy as np


class Residuals:
    def __init__(self, bound: int | None = None, spill: MutableMapping[str, np.ndarray] | None = None):
        if bound is not None and spill is None:
            raise ValueError("a bound on residuals in memory needs a spill for the rest")
        self.bound, self.spill = bound, spill
        self.memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self.spilled = 0  # residuals written to the spill so far

    def take(self, client: str) -> np.ndarray | None:
        """The client's residual (None before it first trained); it is the caller's until ``put``."""
        residual = self.memory.pop(client, None)
        if residual is None and self.spill is not None and client in self.spill:
            residual = self.spill.pop(client)
        return residual

    def put(self, client: str, residual: np.ndarray | None) -> None:
        if residual is None:
            return
        self.memory[client] = residual
        self.memory.move_to_end(client)
        while self.bound is not None and len(self.memory) > self.bound:
            oldest, vec = self.memory.popitem(last=False)
            self.spill[oldest] = vec
            self.spilled += 1

    def forget(self, client: str) -> None:
        """The client crashed: its residual is gone with it."""
        self.memory.pop(client, None)
        if self.spill is not None:
            self.spill.pop(client, None)
