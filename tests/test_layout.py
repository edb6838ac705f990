"""The layout keeps its promises: one namespace, core free of I/O and runtimes, no import cycles."""

import ast
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "emu", "real", "host", "report")
MAX_LINES = 400  # a longer module is split, not justified


def modules():
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
            yield "dtemu." + ".".join(parts), path


def imports(path: Path, annotations: bool = False) -> set[str]:
    """What the module imports, at its top or in a function; under ``if TYPE_CHECKING:`` (names for
    annotations) only with ``annotations``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not annotations and isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_distribution_installs_one_top_level_package():
    assert metadata.distribution("dtemu").read_text("top_level.txt").split() == ["dtemu"]


def test_the_package_list_matches_the_folders():
    """pyproject.toml names every package by hand (package-dir maps dtemu.X to X/): a folder it
    forgets is missing from a wheel although an editable install finds it."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"dtemu." + ".".join(p.parent.relative_to(ROOT).parts)
               for top in PACKAGES for p in (ROOT / top).rglob("__init__.py")}
    assert set(tool["packages"]) == folders
    assert tool["package-dir"] == {f"dtemu.{top}": top for top in PACKAGES}


def test_static_readers_find_each_package_where_it_installs():
    """dtemu/ in the checkout is the installed namespace as a type checker or an import-graph tool
    sees it without importing: a link per package folder, nothing else (no __init__.py: the
    installed dtemu is a namespace too)."""
    links = ROOT / "dtemu"
    assert sorted(p.name for p in links.iterdir()) == sorted(PACKAGES)
    for top in PACKAGES:
        assert (links / top).is_symlink() and (links / top).resolve() == ROOT / top
        assert str((links / top).readlink()) == f"../{top}"   # relative: the checkout moves whole


def test_no_mode_branches_outside_the_registry():
    """A mode is one object (core.modes): nothing else compares a scenario's mode to a name."""
    import re

    branch = re.compile(r"""\.mode\s*(==|!=|in\b)|mode\s*(==|!=)\s*["'](fl|ddp|ps|geo)["']""")
    found = [f"{path.relative_to(ROOT)}:{i}" for name, path in modules() if not name.startswith("dtemu.core.modes")
             for i, line in enumerate(path.read_text().splitlines(), 1) if branch.search(line)]
    assert found == []


def test_core_does_no_io_and_imports_no_runtime():
    banned = ("simpy", "cyclonedds", "dtemu.emu", "dtemu.real", "dtemu.host", "dtemu.report",
              "urllib", "socket", "subprocess", "threading", "yaml.safe_load_all")
    bad = {name: sorted(i for i in imports(path) if i.split(".")[0] in banned or i.startswith(banned))
           for name, path in modules() if name.startswith("dtemu.core")}
    assert {k: v for k, v in bad.items() if v} == {}


# What each layer may not import (annotations included): the runtimes stand beside each other on
# host and core, and report reads what both write; host serves both runtimes and reads no report.
BELOW_ONLY = {"dtemu.emu": ("dtemu.real", "dtemu.report"), "dtemu.real": ("dtemu.emu", "dtemu.report"),
              "dtemu.host": ("dtemu.emu", "dtemu.real", "dtemu.report")}


def test_layers_point_down_only():
    bad = [f"{name} imports {i}" for name, path in modules() for layer, banned in BELOW_ONLY.items()
           if name.startswith(layer + ".") or name == layer
           for i in sorted(imports(path, annotations=True)) if i.startswith(banned)]
    assert bad == []


def test_the_scenario_imports_no_role():
    """A scenario is data: it knows its sections through the registry (core.modes), which names the
    roles' code by address; importing it brings in no role, however deep."""
    known = dict(modules())
    seen, todo = set(), ["dtemu.core.scenario"]
    while todo:
        name = todo.pop()
        if name in seen or name not in known:
            continue
        seen.add(name)
        todo += [i for i in imports(known[name], annotations=True) if i in known]
    roles = {"dtemu.core.fl.client", "dtemu.core.fl.controller", "dtemu.core.esync.state_server",
             "dtemu.core.ddp.worker", "dtemu.core.geo.roles", "dtemu.core.flower.server", "dtemu.core.flower.client"}
    assert seen & roles == set()


def test_no_import_cycles():
    """Not even through annotations (``if TYPE_CHECKING:``) or a function's own imports."""
    known = dict(modules())
    graph = {name: {i for i in imports(path, annotations=True) if i in known and i != name}
             for name, path in known.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    # A package's __init__ importing its own modules is not a cycle between modules.
    cycles = [c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".") for a, b in zip(c, c[1:]))]
    assert cycles == []


def test_no_module_is_long():
    long = [f"{path.relative_to(ROOT)}: {n} lines" for _, path in modules()
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert long == [], f"split these (at most {MAX_LINES} lines a module)"
