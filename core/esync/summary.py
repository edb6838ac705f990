"""The state server's part of summary.json (core.modes.fl asks for it under fl.algorithm esync)."""

from __future__ import annotations

from typing import Any

from dtemu.core.esync.state_server import StateServerResult


def state_server_record(result: Any) -> dict:
    """The state server node's record: the questions it answered, how, and what it refused."""
    if isinstance(result, StateServerResult):
        return {"queries": result.queries, "answers": dict(result.answers), "rejected": dict(result.rejected)}
    return {}


def state_server_summary(record: dict) -> dict:
    """summary.json's ``state_server``, from its node's record."""
    return {k: record.get(k) for k in ("queries", "answers", "rejected") if k in record}
