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
import sys
import time
from pathlib import Path

import pytest

from dtemu.host.datasets import raw_dir, resolve_root
from dtemu.host.rundir import read_events_partial

ROOT = Path(__file__).resolve().parent.parent
# Where the CLI looks ($DTEMU_DATA, else the user cache); tests never download.
DATA = str(resolve_root(None))

ARCHIVES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
HAVE_MNIST = all((raw_dir(DATA, "mnist") / f).is_file() for f in ARCHIVES)

needs_mnist = pytest.mark.skipif(
    not HAVE_MNIST, reason=f"the MNIST archives are not under {DATA}/MNIST/raw: set DTEMU_DATA to a folder "
                           "holding MNIST/raw/*.gz (or run `emu run` once with internet to fill the cache)")

_domains = itertools.count()


def new_domain() -> int:
    """A DDS domain id in 1..100 (real.launch.MAX_DOMAIN: its ports below the ephemeral range),
    different for each of 100 calls of this test process."""
    return 1 + (os.getpid() * 11 + 37 * next(_domains) + 101) % 100


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


def real_launch(path: Path, out: Path, timeout: float, extra_env: dict | None = None,
                args: tuple[str, ...] = ()) -> tuple[int, str]:
    """``real launch`` of a scenario file on a fresh domain, every rank killed whatever happens:
    (exit code, the tail of its output)."""
    cmd = [sys.executable, "-m", "dtemu.real.cli", "launch", str(path), "--out", str(out), "--no-tui",
           "--timeout", str(timeout), "--time-scale", "1", "--domain", str(new_domain()), *args]
    proc = subprocess.Popen(cmd, env={**env(), **(extra_env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout + 30)
    finally:
        kill_group(proc)
    return proc.returncode, output.decode(errors="replace")[-3000:]


def scenario_file(folder: Path, raw: dict) -> Path:
    path = folder / f"{raw['name']}.json"  # JSON is YAML
    path.write_text(json.dumps(raw))
    return path


class Ranks:
    """``real run`` processes of one scenario on one domain; all killed by ``close``."""

    def __init__(self, scenario: Path, folder: Path):
        self.scenario = scenario
        self.folder = folder
        self.domain = new_domain()
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, rank: int, name: str, *overrides: str, args: tuple[str, ...] = (),
              extra_env: dict | None = None) -> subprocess.Popen:
        """``args``: more arguments of ``real run`` (``--append`` for a restarted rank)."""
        cmd = [sys.executable, "-m", "dtemu.real.cli", "run", str(self.scenario), "--rank", str(rank),
               "--out", str(self.folder / name), "--no-tui", "--domain", str(self.domain), "--threads", "1",
               *args]
        for o in overrides:
            cmd += ["--set", o]
        log = open(self.folder / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(cmd, cwd=ROOT, env={**env(), **(extra_env or {})}, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()
        return self.procs[name]

    def kill(self, name: str) -> None:
        kill_group(self.procs[name])

    def wait(self, name: str, timeout: float) -> int:
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} did not exit within {timeout:g}s\n{self.logs()}")

    def events(self, name: str) -> list[dict]:
        return read_events_partial(self.folder / name)[0]

    def wait_event(self, name: str, kind: str, timeout: float, **fields) -> dict:
        """The first event of ``name`` of this kind with these fields; polls its events.jsonl."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events(name):
                if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items()):
                    return e
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.01)
        pytest.fail(f"no {kind} {fields} from {name} within {timeout:g}s\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
                         for p in sorted(self.folder.glob("*.log")))

    def close(self) -> None:
        for name in self.procs:
            self.kill(name)


def copy_run(folder: Path, to: Path, edit_events=lambda lines: lines, edit_summary=lambda s: s) -> Path:
    """A copy of run folder ``folder`` at ``to``, its event lines and summary edited (what an audit
    must find); ``edit_summary=None``: no summary, as a run killed before its end leaves it."""
    to.mkdir()
    (to / "scenario.json").write_text((folder / "scenario.json").read_text())
    if edit_summary is not None:
        (to / "summary.json").write_text(json.dumps(edit_summary(json.loads((folder / "summary.json").read_text()))))
    lines = (folder / "events.jsonl").read_text().splitlines(keepends=True)
    (to / "events.jsonl").write_text("".join(edit_events(lines)))
    return to
