"""What the FL controller's inbox (core.runtime.inbox, every server's) needs of FL: a client's update
answers the client's command, tagged (round, seed); it can be used where its packet decodes to the
model's size, is finite and within ``fl.max_update_norm``.  Any other tag is an older command's
answer: late."""

from __future__ import annotations

from dtemu.core.compression import codecs
from dtemu.core.errors import AuthError, DecodeError, RejectedUpdate
from dtemu.core.fl.aggregate import Update, check_update
from dtemu.core.runtime.inbox import Answer, Inbox
from dtemu.core.runtime.verdict import ACCEPTED, REFUSED, Verdict
from dtemu.core.wire import messages
from dtemu.core.wire.messages import ClientUpdate
from dtemu.core.wire.topics import CLIENT_UPDATE


class UpdateReader:
    def __init__(self, dim: int, max_norm: float | None, sealed: bool):
        self.dim, self.max_norm, self.sealed = dim, max_norm, sealed

    def read(self, src: str, sealed) -> Answer:
        up = messages.decode(sealed.data)
        if not isinstance(up, ClientUpdate):
            raise DecodeError(f"expected a ClientUpdate, got a {type(up).__name__}")
        if self.sealed and (up.client, up.round) != (sealed.sender, sealed.round):
            raise AuthError("forged", f"{sealed.sender!r} signed an update of {up.client!r} "
                                      f"for round {up.round} as round {sealed.round}")
        return Answer(up.client, (up.round, up.seed), up)

    def check(self, answer: Answer, question) -> Verdict:
        up = answer.body
        try:
            update = Update(up.client, up.num_samples, up.kind, codecs.decode(up.packet, expected_dim=self.dim))
            check_update(update, self.dim, self.max_norm)
        except (DecodeError, RejectedUpdate) as err:
            return Verdict(REFUSED, "rejected", str(err))
        return Verdict(ACCEPTED, "accepted", item=update)


def update_inbox(clients, dim: int, max_norm: float | None, sealer) -> Inbox:
    """The controller's inbox: ``clients`` (every client of the scenario) may answer."""
    return Inbox(sealer, CLIENT_UPDATE, UpdateReader(dim, max_norm, sealer.enabled), members=clients)
