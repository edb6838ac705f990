"""Run folders in, PNG figures and a Markdown table out.

    emu report RUN [RUN ...] --out DIR

Reading a run (``load_run``) and labelling runs (``run_labels``) are shared by
every kind of report; everything named ``fl_*`` / ``plot_fl_*`` is the
federated-learning codec comparison (bytes, communication time, round time,
accuracy per codec); everything named ``ddp_*`` / ``plot_ddp_*`` is the
data-parallel comparison of the dense baseline with DGC (bytes per step,
accuracy, communication time per window, ``ddp.md``); ``geo_*`` is training
across data centres (WAN bytes per node and round, time to accuracy, accuracy over
time, ``geo.md``).  Each mode has an entry in ``REPORTS``.

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas, never
through pyplot, so importing this module changes no global backend.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Callable


# Every name of the report, importable from here as before it was split in three.
from dtemu.report.ddp import *  # noqa: F401,F403
from dtemu.report.fl import *  # noqa: F401,F403
from dtemu.report.runs import *  # noqa: F401,F403
from dtemu.report.runs import ReportError, Run, load_run
from dtemu.host.resolve import resolve
from dtemu.core.modes import MODES




# Each mode's report page (core.modes names it): (its runs, the out folder) -> (files written, table).
REPORTS: dict[str, Callable[[list[Run], Path], tuple[list[Path], str]]] = {
    name: resolve(mode.report) for name, mode in MODES.items() if mode.report}


def default_out(runs: list[str]) -> str:
    """Beside the runs it reads: never ./report, which in a checkout is this package's own folder."""
    first = Path(runs[0])
    return str(first / "report" if len(runs) == 1 else first.parent / "report")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="emu report", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (events.jsonl, summary.json, ...)")
    parser.add_argument("--out", help="folder for the figures and report.md / ddp.md (default: RUN/report for "
                                      "one run, report/ beside the first run for several)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = default_out(args.runs)
    try:
        runs = [load_run(p) for p in args.runs]
    except ReportError as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    by_mode: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_mode[run.mode].append(run)
    unknown = sorted(set(by_mode) - set(REPORTS))
    if unknown:
        print(f"report: no report for mode {', '.join(unknown)} yet (known: {', '.join(REPORTS)})",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for mode, group in by_mode.items():
        for run in group:
            if run.bad_lines:
                print(f"report: {run.path}: skipped {run.bad_lines} unreadable event lines", file=sys.stderr)
        written, table = REPORTS[mode](group, out)
        print(table)
        for path in written:
            print(f"wrote {path}")
    return 0
