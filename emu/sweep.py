"""``emu sweep``: one scenario run over a grid of values, and the table of what each did.

    emu sweep SCENARIO --vary KEY=V1,V2[,...] [--vary KEY=...] [--set KEY=VALUE] [--out DIR]

Every combination of the ``--vary`` values is one ``emu run`` of the scenario
with those values set (on top of any ``--set``), in ``DIR/<key=value,...>/``.
A value list is comma-separated, or a YAML list (``--vary 'faults.offline=[[], [{node: client1,
start_s: 3}]]'``) where a value holds a comma.  Every combination is checked
before the first run starts (a bad key or value: exit 2).  A run whose folder
already holds a finished ``summary.json`` is read, not run again, so a sweep
that was stopped goes on where it stopped.  ``DIR/sweep.md`` and
``DIR/sweep.json`` hold one row per run: the values, the unit of work done, the
final accuracy, the time to each target, bytes up and down, the virtual time,
the wall time and the model's hash.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from pathlib import Path

COLUMNS = ("final_accuracy", "time_s", "bytes_up", "bytes_down", "wall_time_s", "model_sha256")


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run a scenario over a grid of values and tabulate the runs",
                       description=" ".join(__doc__.split("\n\n")[2:]).replace("\n", " "))
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                   help="a key and the values it takes (repeatable: every combination runs)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value in every run (repeatable)")
    p.add_argument("--out", help="folder for the runs and the table (default: runs/sweep-<name>-<date>-<time>)")
    p.add_argument("--no-code", action="store_true", help="refuse a scenario that names code (as emu run)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="FL: worker processes per run (default: 1)")


def grid(varies: list[str]) -> list[list[str]]:
    """Every combination of the ``--vary`` values, each as a list of ``key=value`` assignments."""
    from dtemu.core import bounded_yaml
    from dtemu.core.errors import ScenarioError

    axes = []
    for vary in varies:
        key, sep, text = vary.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise ScenarioError("--vary", f"expected KEY=V1,V2,..., got {vary!r}")
        parsed = bounded_yaml.load(text, f"the values of --vary {key.strip()}")
        values = ([json.dumps(v) if not isinstance(v, str) else v for v in parsed] if isinstance(parsed, list)
                  else [v.strip() for v in text.split(",")])
        axes.append([f"{key.strip()}={v}" for v in values])
    return [list(c) for c in itertools.product(*axes)] if axes else [[]]


def folder_name(assignments: list[str]) -> str:
    """A run's folder: its assignments, made safe for a file name."""
    name = ",".join(assignments) or "as-is"
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", name)[:150]


def main(args) -> int:
    from dtemu.core.errors import DtemuError, ScenarioError
    from dtemu.host.scenario_file import check_code, load_scenario

    from .run import run_emulation

    try:
        combos = grid(args.vary)
        scenarios = [load_scenario(args.scenario, args.overrides + c, allow_code=not args.no_code) for c in combos]
        check_code(scenarios[0])
    except ScenarioError as err:
        print(f"emu sweep: {err}", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/sweep-{scenarios[0].name}-{time.strftime('%Y%m%d-%H%M%S')}")
    rows, failed = [], 0
    for i, (combo, scenario) in enumerate(zip(combos, scenarios), 1):
        folder = out / folder_name(combo)
        summary = _finished(folder)
        if summary is None:
            print(f"[{i}/{len(combos)}] {' '.join(combo) or scenario.name}", flush=True)
            try:
                summary = run_emulation(scenario, folder, jobs=args.jobs)
            except DtemuError as err:
                print(f"emu sweep: {folder}: {type(err).__name__}: {err}", file=sys.stderr)
                failed += 1
                continue
        rows.append(row(combo, scenario, summary, folder))
        write_table(out, args, rows)
    print(f"{len(rows)} runs -> {out / 'sweep.md'}" + (f"; {failed} failed" if failed else ""))
    return 1 if failed else 0


def _finished(folder: Path) -> dict | None:
    """A run folder's summary if the run finished there (a sweep goes on where it stopped)."""
    from dtemu.host.rundir import read_summary

    try:
        summary = read_summary(folder)
    except (OSError, ValueError):
        return None
    return None if not summary or summary.get("failed") else summary


def row(combo: list[str], scenario, summary: dict, folder: Path) -> dict:
    unit = scenario.kind.unit + "s"
    out = {"set": combo, "folder": str(folder), unit: summary.get(unit)}
    out.update({k: summary.get(k) for k in COLUMNS})
    out["time_to_accuracy"] = summary.get("time_to_accuracy") or {}
    return out


def write_table(out: Path, args, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["emu sweep", args.scenario, *(f"--vary {v!r}" for v in args.vary),
                        *(f"--set {s!r}" for s in args.overrides)])
    (out / "sweep.json").write_text(json.dumps({"command": command, "runs": rows}, indent=1) + "\n")
    targets = sorted({t for r in rows for t in r["time_to_accuracy"]})
    unit = next(k for k in rows[0] if k in ("rounds", "steps"))
    head = ["values", unit, "accuracy", *(f"t to {t} (s)" for t in targets), "MB up", "MB down", "virtual s",
            "wall s", "model"]
    lines = [f"`{command}`", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tta = [_num(r["time_to_accuracy"].get(t)) for t in targets]
        cells = [" ".join(r["set"]) or "as is", str(r[unit]), _num(r["final_accuracy"], ".4f"), *tta,
                 _num(r["bytes_up"] / 1e6), _num(r["bytes_down"] / 1e6), _num(r["time_s"]), _num(r["wall_time_s"], ".1f"),
                 f"`{(r['model_sha256'] or '')[:12]}`"]
        lines.append("| " + " | ".join(cells) + " |")
    (out / "sweep.md").write_text("\n".join(lines) + "\n")


def _num(value, fmt: str = ".2f") -> str:
    return "–" if value is None else format(value, fmt)
