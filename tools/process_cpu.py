"""The CPU seconds each process of a command's tree used, and its wall time.

    python -m tools.process_cpu emu run scenarios/examples/flower_quickstart.yaml --set fl.clients=50 --no-tui

Every 0.5 s it reads utime + stime of every descendant from /proc/<pid>/stat (a few microseconds a
process, so it takes nothing measurable from what it measures) and keeps each process's last value;
at the end it prints them with their command lines.  A process's last half second may be missing.
This process is a child subreaper, so a grandchild whose parent exits (a fork server's worker) stays
in the tree.  Where a run is CPU-bound, the sum over the cores' count is the shortest it could be.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

from tools.flower_compare import descendants

PR_SET_CHILD_SUBREAPER = 36
TICKS = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> dict[int, tuple[str, float]]:
    """pid -> (command line, CPU seconds) of ``root``'s descendants (the walk: tools.flower_compare's)."""
    out = {}
    for pid in descendants(root)[1:]:   # (the first is ``root`` itself)
        try:
            stat = open(f"/proc/{pid}/stat").read()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:   # it exited meanwhile
            continue
        fields = stat.rpartition(")")[2].split()   # (the name may hold spaces or ')')
        out[pid] = (cmd.strip()[:100] or stat[stat.index("(") + 1:stat.rindex(")")],
                    (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[int, tuple[str, float]] = {}
    while proc.poll() is None:
        seen.update(_tree(os.getpid()))
        time.sleep(0.5)
    wall = time.perf_counter() - started
    for pid, (cmd, cpu) in sorted(seen.items()):
        print(f"{pid:8d} {cpu:8.2f} s  {cmd}")
    total = sum(cpu for _, cpu in seen.values())
    print(f"wall {wall:.1f} s; CPU {total:.1f} s in all, {total / wall:.2f} cores busy on average "
          f"(of {os.cpu_count()}); exit {proc.returncode}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
