"""``report``, ``audit`` and ``soak``: report's verbs, which ``emu`` and ``real`` take from the entry
point group dtemu.verbs (host.verbs), so that neither runtime imports this layer."""

from __future__ import annotations

import argparse
from typing import Callable


def verbs(sub, command: str) -> dict[str, Callable]:
    """Add ``report``, ``audit`` and ``soak`` to ``command``'s (emu's or real's) subparsers."""
    from . import soak

    add_commands(sub)
    soak.add_parser(sub, command)
    return {"report": run, "audit": run, "soak": lambda args: soak.main(args, command)}


def add_commands(sub) -> None:
    """The ``report`` and ``audit`` subcommands of a CLI's subparsers."""
    rep = sub.add_parser("report", help="figures and a Markdown table from run folders (emu or real)",
                         description="Figures and a Markdown table comparing run folders (emu or real).")
    rep.add_argument("runs", nargs="+", metavar="RUN", help="run folders (events.jsonl, summary.json, ...)")
    rep.add_argument("--out", help="folder for the figures and the table (default: RUN/report for one run, "
                                   "report/ beside the first run for several)")
    aud = sub.add_parser("audit", help="the faults a run met, and whether any data was lost (every mode)",
                         description="Count a run's faults and updates (or steps, iterations, rounds) and check "
                                     "that nothing was lost, for any mode (works on a run that was killed or is "
                                     "still going). Exit 1 if data was lost.")
    aud.add_argument("run", metavar="RUN", help="run folder")
    aud.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    if args.command == "report":
        from .report import main

        return main([*args.runs, *(["--out", args.out] if args.out else [])])
    from .audit import main

    return main([args.run] + (["--json"] if args.json else []))
