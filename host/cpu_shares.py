"""A machine's CPU: a cgroup-v1 group in the ``cpu`` and ``cpuacct`` hierarchies with a bandwidth quota.

A testbed machine (real.machines) gets ``cpus`` of the box's cores: ``cpu.cfs_quota_us`` over a
``cpu.cfs_period_us`` of 5 ms; ``emu calibrate --cpu-share`` and real launch's time scale time a
training step under the same share (``confined``).  The period is short on purpose: at the
kernel's default 100 ms a capped 3 ms training step was bimodal on this box (p90 42-53 ms: a step
that ran out of quota waited for the next period); at 5 ms, four capped processes each stepped
within 10% of one alone (DEVELOPERS.md's facts of this machine).  The kernel's smallest quota is
1 ms, so a share under 0.2 of a core takes a period just long enough to hold it (0.145: 6.9 ms):
rounded up to 1 ms of 5, the Flower row's eleven machines of 0.145 each got 0.2 and ran a call
1.38x faster than their share says (notebook entry 39).  A machine of several processes may also
be given one CPU to run on (``cpu``: a ``cpuset`` group, host.cpu_sets), so that they share it as one
machine's processes do.

Every group is ``dtemu/dtm<pid>-<name>`` under each hierarchy (and ``cpuset``'s, where pinned),
<pid> its maker's, so that ``sweep`` finds and removes what a killed launch or calibration left.  A group reads what the monitors
(real.monitors) need: CPU used and time throttled by its quota; ``sched_s`` reads each of its
threads' time on a CPU and time runnable but waiting (``/proc/<tid>/schedstat``).
"""

from __future__ import annotations

import math
import os
import re
import signal
import time
from contextlib import contextmanager
from pathlib import Path

from dtemu.host import cpu_sets

ROOT = Path(os.environ.get("DTEMU_CGROUP_ROOT", "/sys/fs/cgroup"))
HIERARCHIES = ("cpu", "cpuacct")
PARENT = "dtemu"
PERIOD_US = 5000
MIN_QUOTA_US = 1000   # the kernel's floor for cpu.cfs_quota_us


class CpuShareError(RuntimeError):
    pass


def unavailable() -> str | None:
    """Why CPU shares cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (cgroups)"
    for h in HIERARCHIES:
        if not (ROOT / h / "cgroup.procs").exists():
            return f"the cgroup-v1 {h} controller is not mounted at {ROOT / h}"
    if not (ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return "the kernel has no CPU bandwidth control (cpu.cfs_quota_us)"
    return None


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as err:
        raise CpuShareError(f"cannot write {value!r} to {path}: {err}") from err


def period_for(cpus: float, period_us: int = PERIOD_US) -> int:
    """The period a share of ``cpus`` gets: ``period_us``, or longer where its quota would fall under
    the kernel's 1 ms (a quota of 1 ms over the longer period is the share exactly)."""
    return max(int(period_us), math.ceil(MIN_QUOTA_US / cpus - 1e-9))


class CpuGroup:
    """One machine's CPU share.  ``cpus`` of 1.5 is one and a half cores' worth of time a period;
    ``cpu``: the one CPU it runs on (host.cpu_sets), None for wherever the kernel puts it."""

    def __init__(self, name: str, cpus: float, period_us: int = PERIOD_US, cpu: int | None = None):
        if cpus <= 0:
            raise CpuShareError(f"a CPU share must be positive, not {cpus}")
        self.name = name
        self.cpus = float(cpus)
        self.period_us = period_for(self.cpus, int(period_us))
        self.quota_us = round(self.cpus * self.period_us)
        self.cpu = cpu
        self.paths = _paths_of(name, pinned=cpu is not None)

    def create(self) -> "CpuGroup":
        for h in HIERARCHIES:
            self.paths[h].mkdir(parents=True, exist_ok=True)
        if self.cpu is not None:
            try:
                cpu_sets.create(self.paths[cpu_sets.HIERARCHY], self.cpu)
            except OSError as err:
                raise CpuShareError(f"cannot put {self.name} on CPU {self.cpu}: {err}") from err
        cpu = self.paths["cpu"]
        # The period first: a quota over the old (100 ms) period could be refused as too large below it.
        _write(cpu / "cpu.cfs_period_us", str(self.period_us))
        _write(cpu / "cpu.cfs_quota_us", str(self.quota_us))
        return self

    def join(self, pid: int = 0) -> None:
        """Put process ``pid`` (0: this one) and every thread it has into the group; its children follow."""
        for path in self.paths.values():
            _write(path / "cgroup.procs", str(pid or os.getpid()))

    def tasks(self) -> list[int]:
        try:
            return [int(t) for t in (self.paths["cpu"] / "tasks").read_text().split()]
        except OSError:
            return []

    def usage_s(self) -> float:
        return int((self.paths["cpuacct"] / "cpuacct.usage").read_text()) / 1e9

    def throttled_s(self) -> float:
        for line in (self.paths["cpu"] / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
        return 0.0

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is still inside, then remove the group (a group with tasks cannot be removed)."""
        remove_group(self.paths, timeout_s)


def remove_group(paths: dict[str, Path], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    for path in paths.values():
        while path.exists():
            try:
                pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise CpuShareError(f"cannot remove {path}: tasks {pids} did not die")
                time.sleep(0.02)


def sched_s(tid: int) -> tuple[float, float] | None:
    """(time on a CPU, time runnable but not running) of thread ``tid`` in seconds, or None (it ended).
    The wait includes time the thread's group was throttled by its quota."""
    try:
        fields = Path(f"/proc/{tid}/schedstat").read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def groups() -> list[str]:
    """The names of the groups dtemu has under the cpu hierarchy now."""
    parent = ROOT / "cpu" / PARENT
    return sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.exists() else []


def _paths_of(name: str, pinned: bool) -> dict[str, Path]:
    """A group's directory in each hierarchy it is in (``cpuset``'s too where ``pinned``)."""
    paths = {h: ROOT / h / PARENT / name for h in HIERARCHIES}
    if pinned:
        paths[cpu_sets.HIERARCHY] = cpu_sets.root() / PARENT / name
    return paths


def remove_named(name: str) -> None:
    remove_group(_paths_of(name, pinned=True))   # (a cpuset that is not there is skipped)


OWNER = re.compile(r"^dtm(\d+)-")   # every group's name starts with its maker's pid


def sweep() -> list[str]:
    """Remove the groups whose maker no longer runs (a launch or a calibration killed with SIGKILL)."""
    removed = []
    for name in groups():
        m = OWNER.match(name)
        if m and not alive(int(m.group(1))):
            remove_named(name)
            removed.append(f"cgroup {name}")
    return removed


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_came_from: list[dict[str, Path]] = []   # the groups ``confined`` took this process from, innermost last


@contextmanager
def confined(cpus: float, tag: str | None = None):
    """Run this process under a CPU share for a while (``emu calibrate --cpu-share``: the step timed
    on the share the testbed's machine will have), then back in the group it came from."""
    back = {h: _own_group(h) for h in HIERARCHIES}
    group = CpuGroup(tag or f"dtm{os.getpid()}-calibrate", cpus).create()  # (``sweep`` finds it if we die)
    _came_from.append(back)
    try:
        group.join()
        yield group
    finally:
        _came_from.pop()
        _move_to(back)
        remove_group(group.paths)


@contextmanager
def unconfined():
    """This process back in the groups ``confined`` took it from for a while, then in its share
    again (nothing where it is not confined).  For starting child processes that time a step in
    shares of their own: a child starts in its parent's group, and ten of them importing torch
    inside one 0.145 share took 100 s before any joined its own (Flower's re-timing: 6.5-7.7 min)."""
    if not _came_from:
        yield
        return
    here = {h: _own_group(h) for h in HIERARCHIES}
    _move_to(_came_from[-1])
    try:
        yield
    finally:
        _move_to(here)


def _move_to(groups: dict[str, Path]) -> None:
    for path in groups.values():
        _write(path / "cgroup.procs", str(os.getpid()))


def _own_group(hierarchy: str) -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if hierarchy in controllers.split(","):
            return ROOT / hierarchy / path.lstrip("/")
    return ROOT / hierarchy
