"""The model on its way down (``fl.downlink_codec``): full, or as a compressed delta.

With ``fp32`` (the default) the controller publishes the whole model after every
round, as it always did.  With ``q8``, ``s4`` or ``sq8`` it publishes a
``ModelDelta``: the change from the *reference* model, the one every client is
known to hold, encoded with that codec.  Both sides move the reference the same
way (``reference += decode(packet)``, float32, in round order), so a client that
applied every delta holds exactly the controller's reference and trains from it.

The controller keeps its own model exact: what the codec did not carry this
round stays in ``model - reference`` and goes down in a later delta (error
feedback on the downlink), so nothing is lost, only delayed.  Evaluation,
checkpoints and ``model_sha256`` are of the exact model.

Who is known to hold the reference: a client present (``WaitPeers``) at every
publish since it last got a full model, that answered every round it was asked
in.  Any other client (it was away, restarted, lost a delta, or did not answer)
is *stale*: at the next publish it gets the full reference, alone, before the
delta goes to everyone; a client ignores a delta whose base it does not hold.
A late joiner or restarted node gets the latest durable model message: if that
is a delta, it is stale until the controller sends it the full model.
"""

from __future__ import annotations

import numpy as np

from dtemu.core import events as ev
from dtemu.core.compression import codecs
from dtemu.core.runtime.requests import Send, WaitPeers
from dtemu.core.wire import messages
from dtemu.core.wire.messages import ModelBlob, ModelDelta
from dtemu.core.wire.topics import MODEL_BLOB

FP32 = codecs.CodecParams("fp32")


class Downlink:
    """The controller's side: the reference model and who may not hold it."""

    def __init__(self, fl, clients: tuple[str, ...]):
        self.params = codecs.CodecParams(fl.downlink_codec, chunk=fl.chunk, density=fl.density)
        self.clients = clients
        self.reference: np.ndarray | None = None
        self.round = -1  # the round of the reference
        self.stale: set[str] = set()

    def full(self, round_: int, weights: np.ndarray) -> bytes:
        """The full model (every client holds it once it arrives): it becomes the reference."""
        self.reference, self.round = np.array(weights, dtype=np.float32, copy=True), round_
        return messages.encode(ModelBlob.of(round_, codecs.encode(self.reference, FP32)))

    def missed(self, clients) -> None:
        """These clients were asked and did not answer: they may not hold the reference."""
        self.stale.update(clients)

    def publish(self, ctx, round_: int, weights: np.ndarray, seal):
        """Send the model after ``round_``: the full reference to the stale, then the delta to all."""
        present = yield WaitPeers(self.clients, deadline=ctx.now())
        self.stale.update(c for c in self.clients if c not in present)
        behind = tuple(c for c in self.clients if c in self.stale and c in present)
        if behind:  # the reference as it is now, then the delta on top, like everyone else
            yield Send(MODEL_BLOB, seal(MODEL_BLOB, self.round, self._full_reference()), to=behind)
            self.stale.difference_update(behind)
        base = self.round
        packet = codecs.encode(np.asarray(weights, dtype=np.float32) - self.reference, self.params)
        self.reference = self.reference + codecs.decode(packet, expected_dim=self.reference.size).to_dense()
        self.round = round_
        data = messages.encode(ModelDelta.of(round_, base, packet))
        ctx.emit(ev.MODEL_SENT, round=round_, codec=self.params.name, bytes=len(data), base=base,
                 full_to=len(behind))
        yield Send(MODEL_BLOB, seal(MODEL_BLOB, round_, data))

    def _full_reference(self) -> bytes:
        return messages.encode(ModelBlob.of(self.round, codecs.encode(self.reference, FP32)))


class HeldModel:
    """The client's side: the newest full model it got and the deltas on top, as the bytes
    that arrived (shared in emu); the weights are made only when the client trains."""

    def __init__(self):
        self.round = -1
        self.full: bytes | None = None
        self.deltas: list[bytes] = []

    def take_full(self, round_: int, data: bytes) -> None:
        self.round, self.full, self.deltas = round_, data, []

    def take_delta(self, delta: ModelDelta, data: bytes) -> bool:
        """Apply-later a delta; False if its base is not the model held (this client is stale)."""
        if self.full is None or delta.base != self.round:
            return False
        self.deltas.append(data)
        self.round = delta.round
        return True

    def weights(self, dim: int) -> np.ndarray:
        w = codecs.decode(messages.decode(self.full).packet, expected_dim=dim).to_dense()
        for data in self.deltas:
            w = w + codecs.decode(messages.decode(data).packet, expected_dim=dim).to_dense()
        return w
