"""Verbs that a layer above plugs into the ``emu`` and ``real`` commands.

report/ reads run folders (``report``, ``audit``) and runs the soaks it then audits (``soak``). It
sits above emu and real, which may not import it, so it declares its verbs instead: the entry point
group ``dtemu.verbs`` in pyproject.toml names a function ``add(sub, command)`` that adds its
subcommands to a command's subparsers and returns ``{verb: run(args) -> exit code}``; each runner
becomes its subcommand's ``args.plugged``. The command ("emu" or "real") says which runtime a verb
such as ``soak`` drives.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Callable

GROUP = "dtemu.verbs"


def plug(sub, command: str) -> None:
    """Add every declared verb to ``sub`` (argparse's subparsers), its runner as ``args.plugged``."""
    runners: dict[str, Callable] = {}
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        runners.update(point.load()(sub, command))
    if not runners:  # an install from before the group: say so rather than "invalid choice"
        raise RuntimeError(f"no {GROUP} entry points: reinstall dtemu (pip install -e .)")
    for verb, run in runners.items():
        sub.choices[verb].set_defaults(plugged=run)
