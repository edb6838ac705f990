"""host.heap: a training process keeps its heap, so that its passes do not fault their buffers in again
after each message (docs/notebook/ entry 37)."""

import subprocess
import sys

import pytest

from dtemu.host import heap

CHURN = """
import resource, sys, threading
import numpy as np
from dtemu.host import heap
kept = heap.keep()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def churn():
    a = np.ones(1_200_000, np.float32); b = a * 2; del a, b
def each(n):   # in the main thread, or each time in a thread of its own (as a Flower call runs)
    for _ in range(n):
        if THREADS:
            t = threading.Thread(target=churn); t.start(); t.join()
        else:
            churn()
each(3)   # (the heap grows to hold them once)
before = faults()
each(20)   # a 4.8 MB message and its decoding, freed, as between a rank's passes
print(kept, (faults() - before) / 20)
"""


def _churn(env_extra: dict, threads: bool = False) -> tuple[bool, float]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES", heap.OFF)}
    out = subprocess.run([sys.executable, "-c", f"THREADS = {threads}\n" + CHURN], env={**env, **env_extra}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", float(out[1])


@pytest.mark.skipif(heap._glibc() is None, reason="not glibc's malloc")
def test_a_kept_heap_takes_no_faults_from_a_messages_churn():
    kept, faults = _churn({})
    assert kept and faults < 50
    left, faults_left = _churn({heap.OFF: "0"})
    assert not left and faults_left > 500   # glibc's defaults map and unmap each buffer


@pytest.mark.skipif(heap._glibc() is None, reason="not glibc's malloc")
def test_a_thread_of_its_own_each_time_takes_no_faults_either():
    kept, faults = _churn({}, threads=True)
    assert kept and faults < 50


def test_the_users_allocator_settings_win():
    assert heap.keep({heap.OFF: "0"}) is False
    assert heap.keep({"MALLOC_TRIM_THRESHOLD_": "1000"}) is False
    assert heap.keep({"LD_PRELOAD": "/usr/lib/libjemalloc.so"}) is False
    assert heap.keep({"MALLOC_ARENA_MAX": "4"}) is False
    assert heap.keep({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) is False
