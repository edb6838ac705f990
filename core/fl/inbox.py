"""The FL controller's inbox, with no I/O (as h11 is for HTTP): offer it a message from the
update topic and it answers a ``Verdict`` (core.runtime.verdict, every inbox's): accepted, late,
duplicate or refused, with the reason
the run counts it under.  Which commands are outstanding (a round's, or each client's under
fedasync) and who has answered are its state; the controller logs and counts what it answers
(core.runtime.refusal) and decides what an accepted update does.
"""

from __future__ import annotations

from dtemu.core.compression import codecs
from dtemu.core.errors import AuthError, DecodeError, RejectedUpdate
from dtemu.core.fl.aggregate import Update, check_update
from dtemu.core.wire import messages
from dtemu.core.runtime.verdict import ACCEPTED, DUPLICATE, LATE, REFUSED, Verdict, opened
from dtemu.core.wire.messages import ClientUpdate
from dtemu.core.wire.topics import CLIENT_UPDATE

GIVEN_UP = (-1, -1)  # the command a client given up is to answer: none, so its update is late


class UpdateInbox:
    """``expect(client, round, seed)``: the command a client is to answer; ``offer(msg)``: a Verdict."""

    def __init__(self, clients, dim: int, max_norm: float | None, sealer):
        self.clients = clients          # every client of the scenario (a set or a range-like container)
        self.dim, self.max_norm, self.sealer = dim, max_norm, sealer
        self.expected: dict[str, tuple[int, int]] = {}   # client -> (round, seed) of its command
        self.answered: set[str] = set()
        # A synchronous round's command: what an update from a client not asked is late against.
        self.current: tuple[int, int] | None = None

    def expect(self, client: str, round_: int, seed: int) -> None:
        self.expected[client] = (round_, seed)
        self.answered.discard(client)

    def settled(self, client: str) -> None:
        """``client``'s command is answered (fedasync): nothing more is expected from it for now."""
        self.expected.pop(client, None)

    def give_up(self, client: str) -> None:
        """``client`` answered too late to wait for (fedasync): whatever it still sends is late."""
        self.expected[client] = GIVEN_UP

    def open_round(self, clients, round_: int, seed: int) -> None:
        """A synchronous round: ``clients`` are asked the same command; nothing else is expected."""
        self.expected = dict.fromkeys(clients, (round_, seed))
        self.answered = set()
        self.current = (round_, seed)

    def offer(self, msg) -> Verdict:
        up, refused = opened(self.sealer, CLIENT_UPDATE, msg.src, msg.data, self._decode)
        if refused is not None:
            return refused
        wanted = self.expected.get(up.client, self.current)
        if wanted is not None and (up.round, up.seed) != wanted:
            return Verdict(LATE, "late", message=up)
        if up.client not in self.expected or up.client in self.answered:
            reason = ("duplicate" if up.client in self.answered else "not asked" if up.client in self.clients
                      else "unknown client")
            return Verdict(DUPLICATE if reason == "duplicate" else REFUSED, reason, message=up)
        try:
            payload = codecs.decode(up.packet, expected_dim=self.dim)
            update = Update(up.client, up.num_samples, up.kind, payload)
            check_update(update, self.dim, self.max_norm)
        except (DecodeError, RejectedUpdate) as err:
            return Verdict(REFUSED, "rejected", str(err), message=up)
        self.answered.add(up.client)
        return Verdict(ACCEPTED, "accepted", message=up, item=update)

    def _decode(self, sealed) -> ClientUpdate:
        up = messages.decode(sealed.data)
        if not isinstance(up, ClientUpdate):
            raise DecodeError(f"expected a ClientUpdate, got a {type(up).__name__}")
        if self.sealer.enabled and (up.client, up.round) != (sealed.sender, sealed.round):
            raise AuthError("forged", f"{sealed.sender!r} signed an update of {up.client!r} "
                                      f"for round {up.round} as round {sealed.round}")
        return up
