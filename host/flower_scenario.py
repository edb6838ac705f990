"""A scenario for a Flower app folder, for ``emu run --flower-app DIR`` and ``real launch --flower-app DIR``:
a Flower user's first run needs no scenario file.

The scenario is written as a file (``scenario_for``), so that what ran can be kept and changed: it
names the folder, takes the number of clients from the app's own federation
(``[tool.flwr.federations.<default>] options.num-supernodes``, as Flower's simulation does; else
``CLIENTS``), and leaves dtemu's default links, compute and faults.  ``NEXT`` is what the command
prints after the run: the keys a user changes next, and the two commands that run the file.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from dtemu.core.errors import ScenarioError

CLIENTS = 10  # without a federation that says: as many as Flower's quickstart examples simulate


def app_meta(folder: Path) -> dict:
    try:
        return tomllib.loads((folder / "pyproject.toml").read_text("utf-8"))
    except OSError as err:
        raise ScenarioError("flower.app_dir", f"{folder} is no Flower app: cannot read its pyproject.toml "
                                              f"({err.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ScenarioError("flower.app_dir", f"{folder / 'pyproject.toml'} does not parse: {err}") from None


def supernodes(meta: dict) -> int | None:
    """The default federation's ``options.num-supernodes``, if the app names one."""
    federations = meta.get("tool", {}).get("flwr", {}).get("federations", {})
    chosen = federations.get(federations.get("default", ""), {}) if isinstance(federations, dict) else {}
    value = chosen.get("options", {}).get("num-supernodes") if isinstance(chosen, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def scenario_for(app_dir: str | Path, into: Path, costs: list[str] = ()) -> Path:
    """Write the scenario that runs the app in ``app_dir`` into the folder ``into``, with ``costs``
    (``compute.default.KEY=VALUE``, as emu calibrate gives them); its path."""
    folder = Path(app_dir).resolve()
    meta = app_meta(folder)
    if not meta.get("tool", {}).get("flwr", {}).get("app", {}).get("components"):
        raise ScenarioError("flower.app_dir", f"{folder / 'pyproject.toml'} has no [tool.flwr.app.components] "
                                              "naming its serverapp and clientapp")
    name = re.sub(r"[^A-Za-z0-9._-]", "-", str(meta.get("project", {}).get("name") or folder.name))[:100]
    clients = supernodes(meta) or CLIENTS
    raw = {"name": name, "mode": "flower", "seed": 0,
           "flower": {"app_dir": str(folder)},
           "fl": {"clients": clients}}
    if costs:
        raw["compute"] = {"default": {a.partition("=")[0].rsplit(".", 1)[1]: float(a.partition("=")[2])
                                      for a in costs}}
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"{name}.yaml"
    path.write_text(f"# The Flower app {folder}, as `--flower-app` ran it: dtemu's default links, compute and\n"
                    f"# faults ({clients} clients{' from its federation' if supernodes(meta) else ''}). "
                    "Change the keys below and run this file.\n" + yaml.safe_dump(raw, sort_keys=False))
    return path


def next_steps(path: Path, calibrated: bool) -> str:
    """What to change next, and how to run it again, after a run of ``path``."""
    return "\n".join([
        f"the scenario that ran is {path}; to go on, change it and run it again:",
        "  fl.clients                   the number of SuperNodes",
        "  network.default              every node's link: up_mbps, down_mbps, latency_ms, loss",
        "  compute.nodes.client3        one node's speed, e.g. {slowdown: 5} for a straggler",
        "  compute.default.*            " + ("measured on this machine just now (emu calibrate writes them to a "
                                            "profile: --profile FILE)" if calibrated else
                                            "what a call costs in emu (emu calibrate measures it)"),
        "  faults                       crashes, offline windows, dropouts, partitions",
        "  fl.round_timeout_s           the longest a grid call waits for its replies",
        "and run it:",
        f"  emu run {path}",
        f"  real launch {path}   # the same app, a process per node over DDS",
    ])
