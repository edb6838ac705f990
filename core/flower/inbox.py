"""What a Flower server's inbox (core.runtime.inbox, every server's) needs of Flower: a reply answers
the instruction whose id it names, and only the node it went to may answer it.

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
from dtemu.core.runtime.inbox import Answer, Inbox
from dtemu.core.runtime.verdict import ACCEPTED, REFUSED, Verdict
from dtemu.core.wire.topics import FLOWER_RES


@dataclass(frozen=True)
class Asked:
    """One instruction sent: to whom, of which round and type, and the arrays it carried."""

    node: str
    round: int
    type: str
    arrays: dict


class ReplyReader:
    def __init__(self, check_arrays: bool):
        self.check_arrays = check_arrays

    def read(self, src: str, sealed) -> Answer:
        """A reply answers the instruction it names (its tag: none, an instruction is asked once)."""
        if wire.kind_of(sealed.data) != wire.REPLY:
            raise _NotAReply("a Flower frame, but not a reply")
        reply = wire.decode(sealed.data)
        return Answer(reply.metadata.reply_to_message_id, None, reply)

    def check(self, answer: Answer, question) -> Verdict:
        reply = answer.body
        if self.check_arrays and not reply.has_error():
            try:
                wire.check_reply(reply, question.about.arrays)
            except DecodeError as err:
                return Verdict(REFUSED, "invalid", str(err))
        return Verdict(ACCEPTED, "accepted")


def reply_inbox(sealer, check_arrays: bool = False) -> Inbox:
    """The server's inbox: each instruction sent is asked with ``ask(its id, None, about=Asked,
    sender=its node)`` and closed with ``close`` when its grid call is over."""
    return Inbox(sealer, FLOWER_RES, ReplyReader(check_arrays))


class _NotAReply(DecodeError):
    reason = "not_a_reply"

