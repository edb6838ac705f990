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


def _plain_env() -> dict:
    """This environment without the allocator settings a user may have given (they would win)."""
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "GLIBC_TUNABLES", heap.OFF)}


def _churn(env_extra: dict, threads: bool = False) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", f"THREADS = {threads}\n" + CHURN], env={**_plain_env(), **env_extra},
                         capture_output=True, text=True, check=True).stdout.split()
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


GROW = """
import resource
import numpy as np
from dtemu.host import heap
kept = heap.keep()
touched = heap.pretouch(TOUCH)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
held = [np.ones(250_000, np.float32) for _ in range(48)]   # a first pass's 48 MB of tensors, new to the heap
print(kept, touched, faults() - before)
"""


def _grow(touch: int) -> tuple[bool, int, int]:
    out = subprocess.run([sys.executable, "-c", f"TOUCH = {touch}\n" + GROW], env=_plain_env(), capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", int(out[1]), int(out[2])


@pytest.mark.skipif(heap._glibc() is None, reason="not glibc's malloc")
def test_a_pretouched_heap_holds_a_first_pass_without_faults():
    kept, touched, faults = _grow(128)
    assert kept and touched == 128 and faults < 500
    _, none, faults_untouched = _grow(0)
    assert none == 0 and faults_untouched > 10_000   # 48 MB is 12,000 pages


def test_pretouch_needs_a_kept_heap_and_the_user_sets_its_size():
    assert heap.pretouch_mb({heap.PRETOUCH: "0"}) == 0
    assert heap.pretouch_mb({heap.PRETOUCH: "64"}, processes=100) == 64   # the user's word, as given
    assert 0 <= heap.pretouch_mb({}, processes=10 ** 6) < heap.PRETOUCH_MB   # many on one box: less each
    assert heap.pretouch_mb({}) <= heap.PRETOUCH_MB
    if not heap._kept[0]:   # (this test process's malloc is glibc's defaults: the touch would be trimmed)
        assert heap.pretouch(64) == 0
    with pytest.raises(ValueError, match="DTEMU_PRETOUCH_MB"):
        heap.pretouch_mb({heap.PRETOUCH: "lots"})
