"""What an inbox says of one message: the one type of core.runtime.inbox, the inbox every server
uses (FL's updates, geo's payloads, a Flower server's replies), and one way to open what
arrived.

| kind | meaning |
|---|---|
| ACCEPTED | the role takes it (an update of the round, a reply, a payload; ``item``: what it takes) |
| LATE | an answer to a question no longer asked (an older round, a closed call) |
| DUPLICATE | a second answer to the same question |
| REFUSED | not used, counted under ``reason`` (unsigned, forged, malformed, not_asked, future, ...) |
| EARLY | an answer to a question not asked yet, kept for it (geo's pushes) |
| NOTED, ENDED | a note: a heartbeat or a site's JOIN; MixedSync's END |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from dtemu.core.errors import AuthError, DecodeError

ACCEPTED, LATE, DUPLICATE, REFUSED = "accepted", "late", "duplicate", "refused"
EARLY, NOTED, ENDED = "early", "noted", "ended"


@dataclass(frozen=True)
class Verdict:
    kind: str
    reason: str = ""       # what the run counts it under (a refusal's: malformed, forged, late, ...)
    error: str = ""        # what was wrong, in words
    message: Any = None    # what the bytes decoded to, where they got that far (an update, a reply)
    item: Any = None       # what an accepted message gives the role (FL's checked update)
    asked: Any = None      # what the asker kept with the question it answers (a Flower instruction's Asked)


def opened(sealer, topic: str, src: str, data: bytes, decode: Callable[[Any], Any]) -> tuple[Any, Verdict | None]:
    """``(decode(the opened frame), None)``, or ``(None, the refusal)``: the seal's reason (unsigned,
    forged, replayed: also an AuthError that ``decode`` raises), or malformed for bytes that do not
    decode (a DecodeError's ``reason`` where it names one)."""
    try:
        return decode(sealer.open(topic, src, data)), None
    except AuthError as err:
        return None, Verdict(REFUSED, err.reason, str(err))
    except DecodeError as err:
        return None, Verdict(REFUSED, getattr(err, "reason", "malformed"), str(err))
