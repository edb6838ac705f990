"""Which of the box's CPUs a machine of several processes runs on: one of its own, where its share fits.

Why: a CPU share spread over the box's two CPUs is not one machine's CPU.  The kernel leaves a busy
process on the CPU it runs on and balances the CPUs' load, not the fairness inside one group: three
trainers in one 0.533 share ran two on one CPU and one on the other, and the lone one took half of
the share, the others a quarter each (64-65 passes in 20 s against 33, three runs).  Pinned to one
CPU, the three took a third each (43-45 passes, 0.435-0.461 s a pass against the 0.45 a third of the
share gives), the processor sharing that emu models (emu.machines; notebook entry 54).  On the
testbed it was why a geo site's three workers finished a round 0.07-0.08 s apart where emu's finished
0.02 s apart, and why the round's compute (its slowest worker's) came out 6-11% over emu's while the
workers' mean was not.

So a machine that hosts more than one process gets a CPU of its own where its share fits beside the
shares already placed there (those of the most processes first, then the largest share, each on the
CPU with the most room left): a cgroup-v1
``cpuset`` group of that CPU (host.cpu_shares.CpuGroup).  A machine of one process, or one whose
share fits on no CPU, runs where the kernel puts it, as before: pinned beside a CPU that is full, a
single-threaded process gets half of that CPU, not its share.  The calibration's machines
(host.train_cost) are placed by the same rule, so a step is timed as the testbed will run it.
``DTEMU_CPU_PIN=0`` turns it off (for comparison).
"""

from __future__ import annotations

import os
from pathlib import Path

HIERARCHY = "cpuset"
CAPACITY = 1.0   # a CPU's worth of shares


def root() -> Path:
    """The cpuset hierarchy's root (beside host.cpu_shares's, under ``DTEMU_CGROUP_ROOT``)."""
    return Path(os.environ.get("DTEMU_CGROUP_ROOT", "/sys/fs/cgroup")) / HIERARCHY


def unavailable() -> str | None:
    """Why machines cannot be pinned here, or None."""
    if os.environ.get("DTEMU_CPU_PIN", "").strip().lower() in ("0", "no", "off", "false"):
        return "turned off (DTEMU_CPU_PIN=0)"
    if not (root() / "cpuset.cpus").exists():
        return f"the cgroup-v1 cpuset controller is not mounted at {root()}"
    return None


def parse_list(text: str) -> list[int]:
    """The CPUs of a kernel CPU list ("0-2,4")."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def usable() -> list[int]:
    """The CPUs this box lets dtemu's groups use: the root cpuset's, as far as this process may run."""
    try:
        cpus = parse_list((root() / "cpuset.cpus").read_text())
    except (OSError, ValueError):
        return []
    mine = os.sched_getaffinity(0)
    return [c for c in cpus if c in mine]


def place(shares: list[float], processes: list[int], cpus: list[int] | None = None) -> list[int | None]:
    """Each machine's CPU (None: wherever the kernel puts it): machines of more than one process, those
    of the most processes first (the more there are, the more a spread share favours one of them),
    then the largest share, each on the CPU with the most room left, if its share fits there.  (By
    share alone, the held-out geo row's central machine, its master and global PS, took a CPU that
    a site of four ranks needed, and that site's workers still took 1/2, 1/4 and 1/4 of its share.)"""
    cpus = usable() if cpus is None else cpus
    out: list[int | None] = [None] * len(shares)
    if not cpus or unavailable():
        return out
    room = {c: CAPACITY for c in cpus}
    for m in sorted(range(len(shares)), key=lambda m: (-processes[m], -shares[m])):
        if processes[m] < 2:
            continue
        cpu = max(cpus, key=lambda c: room[c])   # (the first of equals: the lowest number)
        if shares[m] <= room[cpu] + 1e-9:
            out[m] = cpu
            room[cpu] -= shares[m]
    return out


def create(path: Path, cpu: int) -> None:
    """A cpuset group at ``path`` on CPU ``cpu`` (its parent given every CPU and memory node first:
    a new v1 cpuset has none, and a child's must be within its parent's).  OSError if the kernel
    refuses."""
    base = root()
    mems = (base / "cpuset.mems").read_text().strip() or "0"
    for group, cpus in ((path.parent, (base / "cpuset.cpus").read_text().strip()), (path, str(cpu))):
        group.mkdir(parents=True, exist_ok=True)
        (group / "cpuset.cpus").write_text(cpus)
        if not (group / "cpuset.mems").read_text().strip():
            (group / "cpuset.mems").write_text(mems)
