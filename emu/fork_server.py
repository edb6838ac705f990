"""The fork server emu's worker pool forks its workers from (emu.pool), started before anything heavy.

Kept apart from emu.pool, which imports torch: ``emu run`` starts the server first, so that the
server's imports (torch and the jobs' code, ``PRELOAD``) run on one core while the emulator's own
(torch, and a Flower app's torch and flwr) run on the other.  Started after the emulator had imported
torch, the pool waited ~0.9 s for it at the start of every run (a 50-client Flower run of ~12 s).
"""

from __future__ import annotations

import multiprocessing
from multiprocessing import forkserver

from dtemu.host import cores

# What the fork server imports once for every worker: the pool (dtemu first, so the CPU arithmetic
# is fixed before torch loads; then torch and the jobs' code).
PRELOAD = ["dtemu.emu.pool"]


def prestart(jobs: int, threads: int, modules: tuple[str, ...] = ()) -> None:
    """Start the fork server now, with the OpenMP wait policy ``jobs`` workers of ``threads`` threads
    need (it is read when the server loads torch, and its workers inherit it), importing ``modules``
    too (the mode's ``worker_modules``); a later pool forks from it.  (torch.multiprocessing's
    forkserver context is this one, with torch's reductions registered.)"""
    multiprocessing.get_context("forkserver").set_forkserver_preload([*PRELOAD, *modules])
    with cores.spawn_env(cores.wait_policy(jobs, threads)):
        forkserver.ensure_running()
