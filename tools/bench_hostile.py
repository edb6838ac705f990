"""How fast each hostile scenario file of tests/test_hostile_scenarios.py is refused.

    python -m tools.bench_hostile

Each file is refused by ``emu run`` in this process (torch imported once
beforehand: a fresh process pays ~1.5 s for that whatever the file), timed.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import torch  # noqa: F401  (the one-time cost of a process, not of a refusal)
    del torch

    from dtemu.emu.cli import main as emu_main
    from test_hostile_scenarios import CASES, write_case

    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'case':20} {'exit':>4} {'ms':>8}")
        for case in sorted(CASES):
            path = write_case(case, Path(tmp))
            err = io.StringIO()
            t0 = time.perf_counter()
            with contextlib.redirect_stderr(err):
                code = emu_main(["run", str(path), "--no-tui", "--out", str(Path(tmp) / "run")])
            ms = (time.perf_counter() - t0) * 1000
            worst = max(worst, ms)
            print(f"{case:20} {code:>4} {ms:8.1f}")
    print(f"slowest refusal: {worst:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
