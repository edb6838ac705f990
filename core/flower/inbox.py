"""The server's inbox for Flower replies, with no I/O (in the manner of h11): offer it what arrived
and it answers what the bytes are to the run.

An instruction the server sent is *open* until the grid call that sent it closes (its replies are all
in, or its deadline passed).  A reply is then one of:

- accepted: an authentic, well-formed reply from the node asked, to an open instruction.  Its arrays
  are the app's to judge, as in Flower: NaN, another dtype (FedAdam's float64 under NumPy 2 answered
  in float32), other shapes, other keys or part of the model reach the strategy.  With
  ``flower.check_arrays`` they must load, be finite and match what the instruction carried
  (core.flower.wire.check_reply), else the reply is refused as invalid and counted;
- late: to an instruction whose call has closed (the app has moved on);
- duplicate: a second reply to the same instruction;
- refused, with a reason: unsigned or forged (sealed runs), malformed, not a reply, a reply to
  nothing the server sent, from a node that was not asked, or invalid arrays (``check_arrays``).
"""

from __future__ import annotations

from dataclasses import dataclass

from dtemu.core.errors import DecodeError
from dtemu.core.flower import wire
from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, LATE, REFUSED, Verdict, opened


@dataclass(frozen=True)
class Asked:
    """One instruction sent: to whom, of which round and type, and the arrays it carried."""

    node: str
    round: int
    type: str
    arrays: dict


class ReplyInbox:
    def __init__(self, sealer, check_arrays: bool = False):
        self._sealer = sealer  # opens sealed frames (core.wire.auth; the identity without a key)
        self._check_arrays = check_arrays
        self._open: dict[str, Asked] = {}
        self._closed: dict[str, Asked] = {}
        self._answered: set[str] = set()

    def expect(self, message_id: str, asked: Asked) -> None:
        self._open[message_id] = asked

    def close(self, message_ids) -> None:
        """The call that sent these is over: later replies to them are late."""
        for mid in message_ids:
            asked = self._open.pop(mid, None)
            if asked is not None:
                self._closed[mid] = asked

    def offer(self, topic: str, src: str, data: bytes) -> Verdict:
        reply, refused = opened(self._sealer, topic, src, data, _reply)
        if refused is not None:
            return refused
        mid = reply.metadata.reply_to_message_id
        asked = self._open.get(mid) or self._closed.get(mid)
        if asked is None:
            return Verdict(REFUSED, "not_asked", f"a reply to {mid[:40]!r}, which was never sent", message=reply)
        if asked.node != src:
            return Verdict(REFUSED, "wrong_sender", f"{src} answered {asked.node}'s instruction", reply, asked=asked)
        if mid in self._answered:
            return Verdict(DUPLICATE, "duplicate", message=reply, asked=asked)
        if mid in self._closed:
            self._answered.add(mid)
            return Verdict(LATE, "late", message=reply, asked=asked)
        if self._check_arrays and not reply.has_error():
            try:
                wire.check_reply(reply, asked.arrays)
            except DecodeError as err:
                self._answered.add(mid)  # its one answer was unusable: a resend would be a duplicate
                return Verdict(REFUSED, "invalid", str(err), reply, asked=asked)
        self._answered.add(mid)
        return Verdict(ACCEPTED, "accepted", message=reply, asked=asked)

    def asked(self, message_id: str) -> Asked | None:
        return self._open.get(message_id) or self._closed.get(message_id)

    def waiting(self, message_ids) -> int:
        """How many of ``message_ids`` have no answer yet."""
        return sum(1 for mid in message_ids if mid not in self._answered)


class _NotAReply(DecodeError):
    reason = "not_a_reply"


def _reply(sealed):
    """The Flower reply in an opened frame; a DecodeError if it is none."""
    if wire.kind_of(sealed.data) != wire.REPLY:
        raise _NotAReply("a Flower frame, but not a reply")
    return wire.decode(sealed.data)
