"""How many training processes this machine's cores hold, and how their OpenMP threads wait.

torch's OpenMP threads spin after each parallel region, waiting for the next
one.  Alone on its cores that is fast; beside other training processes it burns
the cores they need.  Measured on 2 cores (small CNN, batch 32, ms per sample
per process; ``python -m tools.bench_oversubscribe``, docs/notebook/ "Cores
shared by training processes"): 4 processes x 2 threads 4.06-8.3 with the
runtime's spinning, 0.84-1.06 with ``OMP_WAIT_POLICY=PASSIVE``; 1 process x 2
threads 0.25 spinning and 0.27 passive.

So a process that trains beside others on fewer cores than their threads gets
the passive policy, and one alone keeps spinning.  OpenMP reads the policy once,
when torch loads, so it is set in the environment of the processes a run starts
(``spawn_env``), never changed in a running one.  A policy the user set wins.
The policy changes no arithmetic: only how a thread waits.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

WAIT = "OMP_WAIT_POLICY"


def available() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def fitting(threads: int, cores: int | None = None) -> int:
    """How many processes of ``threads`` torch threads fit the cores without sharing them (at least 1)."""
    return max(1, (cores or available()) // max(1, threads))


def oversubscribed(processes: int, threads: int, cores: int | None = None) -> bool:
    return processes * threads > (cores or available())


def wait_policy(processes: int, threads: int, cores: int | None = None) -> dict[str, str]:
    """The environment for ``processes`` training processes of ``threads`` threads started together."""
    if WAIT in os.environ or not oversubscribed(processes, threads, cores):
        return {}
    return {WAIT: "PASSIVE"}


@contextmanager
def spawn_env(extra: dict[str, str]) -> Iterator[None]:
    """Processes started inside (multiprocessing's spawn, subprocess without env=) inherit ``extra``;
    this process's environment is as it was afterwards."""
    before = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
