"""YAML from untrusted text, within bounds that are checked before any object is built.

A scenario file is input like any other: it may be 50 MB of keys, nested ten
thousand levels deep (PyYAML's composer recurses and raises RecursionError), or
a "billion laughs" of aliases (each small, expanding to gigabytes when the
scenario is copied).  ``load`` first walks the parser's event stream, which
builds nothing and does not recurse, counting what the document would expand
to (an alias counts as its whole anchored subtree), and refuses with a
``ScenarioError`` naming the limit; only then does it build the objects.
"""

from __future__ import annotations

from typing import Any

import yaml

from dtemu.core.errors import ScenarioError

MAX_BYTES = 1 << 20  # a scenario is a page of YAML; a megabyte is far beyond any real one
MAX_DEPTH = 32  # nesting, aliases expanded
MAX_NODES = 100_000  # scalars and collections, aliases expanded


def load(text: str | bytes, where: str) -> Any:
    """The object in ``text``, or ScenarioError (key "" or the limit) if it is not YAML or too big."""
    if len(text) > MAX_BYTES:
        raise ScenarioError("", f"{where} is {len(text):,} bytes; a scenario may have at most {MAX_BYTES:,}")
    try:
        _check_bounds(text, where)
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ScenarioError("", f"{where} is not valid YAML: {err}") from None
    except RecursionError:  # pragma: no cover - _check_bounds stops deep documents first
        raise ScenarioError("", f"{where} is nested too deeply") from None


def _check_bounds(text, where: str) -> None:
    # Per open collection: [nodes so far, deepest child depth, anchor]; per anchor: (nodes, depth).
    stack: list[list] = []
    anchors: dict[str, tuple[int, int]] = {}
    total = 0

    def add(nodes: int, depth: int) -> None:
        nonlocal total
        total += nodes
        if total > MAX_NODES:
            raise ScenarioError("", f"{where} expands to more than {MAX_NODES:,} values (aliases counted "
                                    "in full); a scenario needs far fewer")
        if len(stack) + depth > MAX_DEPTH:
            raise ScenarioError("", f"{where} is nested deeper than {MAX_DEPTH} levels")
        if stack:
            stack[-1][0] += nodes
            stack[-1][1] = max(stack[-1][1], depth)

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            add(0, 1)
            stack.append([1, 0, event.anchor])
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            nodes, depth, anchor = stack.pop()
            if anchor is not None:
                anchors[anchor] = (nodes, depth + 1)
            add(nodes, depth + 1)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                anchors[event.anchor] = (1, 0)
            add(1, 0)
        elif isinstance(event, yaml.AliasEvent):
            nodes, depth = anchors.get(event.anchor, (1, 0))
            add(nodes, depth)
