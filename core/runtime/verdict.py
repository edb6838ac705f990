"""What an inbox says of one message: one type for every server's inbox (FL's updates, ps's rounds,
geo's payloads, a Flower server's replies), each a protocol object with no I/O offered one message
at a time (in h11's manner), and one way to open what arrived.

Every inbox answers with these kinds:

| kind | meaning | inboxes |
|---|---|---|
| ACCEPTED | the role takes it (a round's update, a reply, a payload of the round) | all |
| LATE | an answer to something no longer waited for (a closed round or call) | fl, flower |
| DUPLICATE | a second answer to the same question | fl, flower |
| REFUSED | not used, counted under ``reason`` (summary.json's ``updates``) | all |
| JOIN, NOT_FINITE, IGNORED | a worker's hello; an update that was not finite; another message | ps |
| EARLY, NOTED, ENDED | kept for its round; a heartbeat, JOIN or END taken note of; MixedSync's end | geo |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from dtemu.core.errors import AuthError, DecodeError

ACCEPTED, LATE, DUPLICATE, REFUSED = "accepted", "late", "duplicate", "refused"
JOIN, NOT_FINITE, IGNORED = "join", "not_finite", "ignored"
EARLY, NOTED, ENDED = "early", "noted", "ended"


@dataclass(frozen=True)
class Verdict:
    kind: str
    reason: str = ""       # what the run counts it under (a refusal's: malformed, forged, late, ...)
    error: str = ""        # what was wrong, in words
    message: Any = None    # what the bytes decoded to, where they got that far (an update, a reply)
    item: Any = None       # what an accepted message gives the role (FL's checked update)
    asked: Any = None      # what it answers (a Flower instruction's Asked)
    wan: bool = False      # geo: its bytes crossed the WAN and count as received


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
