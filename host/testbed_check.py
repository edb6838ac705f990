"""Can this host make the testbed of real launch --machines (and so run emu validate)?

It needs root, iproute2's ``ip`` and ``tc``, and the cgroup-v1 cpu and cpuacct controllers
(host.cpu_shares).  Asked before anything is measured or made, so that a refusal costs nothing.
"""

from __future__ import annotations

import os
import shutil

from . import cpu_shares


def unavailable() -> str | None:
    """Why the testbed's machines cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc, cgroups)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    return cpu_shares.unavailable()
