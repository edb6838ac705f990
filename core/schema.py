"""Build typed, validated dataclasses from plain YAML data.

One generic walker over dataclass fields and their type hints, so that every
error names its dotted path, what was expected and what was found:

    fl.codec: expected one of fp32, q8, s4, sq8, got 'int8'

Supported field types: bool, int, float, str, Literal[...], Optional[T],
list[T], dict[str, T] and nested dataclasses.  A field may carry a check in its
metadata (``field(metadata={"check": positive})``) that returns an error text
or None.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from dtemu.core.errors import ScenarioError


def build(cls: type, data: Any, path: str = "") -> Any:
    """Return ``cls`` built from ``data``; raise ScenarioError on the first problem."""
    return _convert(cls, data, path)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else f"{value!r} ({type(value).__name__})"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return "a list"
    if origin is dict:
        return "a mapping"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, path)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except ScenarioError as err:
                errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        raise ScenarioError(path, f"expected {_type_name(tp)}, got {_show(value)}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            raise ScenarioError(path, f"expected {_type_name(tp)}, got {_show(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ScenarioError(path, f"expected a list, got {_show(value)}")
        (item,) = typing.get_args(tp)
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ScenarioError(path, f"expected a mapping, got {_show(value)}")
        _, item = typing.get_args(tp)
        return {str(k): _convert(item, v, _join(path, str(k))) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ScenarioError(path, f"expected a boolean, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(path, f"expected an integer, got {_show(value)}")
        if not -(1 << 63) <= value < (1 << 63):  # no field is wider than 64 bits
            raise ScenarioError(path, f"expected an integer of at most 64 bits, got {value}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(path, f"expected a number, got {_show(value)}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ScenarioError(path, f"expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ScenarioError(path, f"expected a string, got {_show(value)}")
        return value
    raise TypeError(f"schema: unsupported type {tp!r} at {path}")  # a bug in the schema itself


def _build_dataclass(cls: type, value: Any, path: str) -> Any:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ScenarioError(path, f"expected a mapping, got {_show(value)}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in value if k not in fields]
    if unknown:
        raise ScenarioError(
            _join(path, str(unknown[0])),
            f"unknown key (expected one of {', '.join(fields)})",
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, f in fields.items():
        sub = _join(path, name)
        if name in value:
            kwargs[name] = _convert(hints[name], value[name], sub)
            check = f.metadata.get("check")
            if check is not None and kwargs[name] is not None:
                problem = check(kwargs[name])
                if problem:
                    raise ScenarioError(sub, f"{problem}, got {kwargs[name]!r}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ScenarioError(sub, "missing required key")
    return cls(**kwargs)


# Checks for field metadata: each returns an error text or None.
def positive(v: float) -> str | None:
    return None if v > 0 else "expected a value > 0"


def non_negative(v: float) -> str | None:
    return None if v >= 0 else "expected a value >= 0"


def probability(v: float) -> str | None:
    return None if 0 <= v <= 1 else "expected a probability in [0, 1]"


def decay(v: float) -> str | None:
    return None if 0 <= v < 1 else "expected a decay rate in [0, 1)"


def fraction(v: float) -> str | None:
    return None if 0 < v <= 1 else "expected a fraction in (0, 1]"


def each(fn):
    """A check of a number, or of each number of a list (a field that takes either)."""
    def every(v) -> str | None:
        for i, x in enumerate(v if isinstance(v, list) else [v]):
            if (why := fn(x)) is not None:
                return f"{why} (item {i})" if isinstance(v, list) else why
        return None
    return every


def between(lo: int, hi: int, why: str = ""):
    """A check: ``lo <= v <= hi`` (``why``: what sets the bound, e.g. the wire field that carries it)."""
    def within(v: float) -> str | None:
        return None if lo <= v <= hi else f"expected {lo}..{hi:,}{f' ({why})' if why else ''}, got {v:,}"
    return within


U16, U32 = (1 << 16) - 1, (1 << 32) - 1


def check(fn) -> dict:
    """``field(default=..., metadata=check(positive))``."""
    return {"check": fn}
