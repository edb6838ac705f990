"""The one refusal path: a role that will not use a message counts it by reason, charges its bytes
apart from the traffic it accepted (``Context.refused``) and logs it, all three, always."""

from __future__ import annotations

from collections import Counter


def refuse(ctx, counts: Counter | None, msg, count_as: str, event: str, **fields) -> None:
    """``msg`` refused: ``counts[count_as]`` + 1 (None: the caller counts), its bytes charged, and
    ``event`` logged with ``fields`` (the event's own: a reason, the sender, the error...)."""
    if counts is not None:
        counts[count_as] += 1
    ctx.refused(msg)
    ctx.emit(event, **fields)
