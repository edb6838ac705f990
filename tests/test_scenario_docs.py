"""docs/scenarios.md lists every key of the scenario schema, and no key that is not one."""

import dataclasses
import re
import typing
from pathlib import Path

from dtemu.core.scenario import Scenario

DOC = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"


def schema_keys(cls=Scenario, prefix="") -> set[str]:
    """Every documented unit of the schema: leaf keys (a mapping of plain values is one); a mapping of
    nodes (or sites) as ``<node>``;
    a nested section whose keys are documented together (``network.default``) by its name."""
    keys = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind) and f.name != "default":
            keys |= schema_keys(kind, path + ".")
        elif typing.get_origin(kind) is dict and dataclasses.is_dataclass(typing.get_args(kind)[1]):
            keys.add(path + ".<node>")
        else:
            keys.add(path)
    return keys


def documented_keys() -> set[str]:
    keys = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            keys |= set(re.findall(r"`([^`]+)`", first))
    return keys


def test_every_schema_key_is_documented_and_nothing_else():
    schema, documented = schema_keys(), documented_keys()
    # a section may be documented as a whole or key by key
    undocumented = {k for k in schema if k not in documented and not any(d.startswith(k + ".") for d in documented)}
    schema |= {d for d in documented if any(d.startswith(k + ".") for k in schema)}
    assert sorted(undocumented) == []
    assert sorted(documented - schema) == []  # documented keys that do not exist
