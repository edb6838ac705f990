"""Helpers shared by the tests: the MNIST archives, DDS domains, subprocesses.

One allocator of DDS domain ids per test process, so two tests never meet on
a domain; every subprocess runs in a session of its own so that its whole
group (a launcher and its ranks) can be killed whatever happened.
"""

import itertools
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = os.environ.get("DTEMU_DATA") or str(ROOT.parent / "shared" / "data")

ARCHIVES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
HAVE_MNIST = all((Path(DATA) / "MNIST" / "raw" / f).is_file() for f in ARCHIVES)

needs_mnist = pytest.mark.skipif(not HAVE_MNIST, reason="MNIST archives not found (set DTEMU_DATA)")

_domains = itertools.count()


def new_domain() -> int:
    """A DDS domain id in 1..230, different for each call of this test process."""
    return 1 + (os.getpid() * 11 + 37 * next(_domains) + 101) % 230


def env() -> dict:
    return {**os.environ, "DTEMU_DATA": DATA, "PYTHONUNBUFFERED": "1"}


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def scenario_file(folder: Path, raw: dict) -> Path:
    path = folder / f"{raw['name']}.json"  # JSON is YAML
    path.write_text(json.dumps(raw))
    return path
