"""One envelope for every message of every mode (core.wire.envelope): each family's messages start
with it, a message of another family is refused as such, and no message grew a byte."""

from __future__ import annotations

import numpy as np
import pytest

from dtemu.core.ddp.frames import Frame, decode_frame, encode_frame
from dtemu.core.errors import DecodeError, FrameError, GeoPayloadError, MessageError, StateMessageError
from dtemu.core.geo import payload as gp
from dtemu.core.esync import state_messages as pm
from dtemu.core.wire import envelope, messages

V = np.arange(4, dtype=np.float32)
ONE_OF_EACH = {
    "fl": messages.encode(messages.TrainCmd(3, 0, 1, 0.1, 7)),
    "state": pm.encode_state(pm.StateMsg(pm.QUERY, 3, 1, pm.Status(3, 1, 2, 0.1, 0.01, 5.0))),
    "geo": gp.encode_dense(3, V),
    "ddp": encode_frame(Frame(0, 3, "dense", 0, 1, 2, 0, 1, 4, b"abcd")),
}
DECODERS = {
    "fl": (messages.decode, MessageError),
    "state": (pm.decode_state, StateMessageError),
    "geo": (lambda raw: gp.decode(raw, 4), GeoPayloadError),
    "ddp": (lambda raw: decode_frame(raw, world=2, max_total=1 << 20), FrameError),
}


def test_every_family_starts_with_the_envelope_and_its_own_types():
    for family, raw in ONE_OF_EACH.items():
        type_, _, _ = envelope.unpack(raw, family)
        assert raw[:4] == envelope.MAGIC and envelope.TYPES[type_][0] == family


def test_the_type_table_names_each_type_once():
    types = [t for names in envelope.FAMILIES.values() for t in names.values()]
    assert len(types) == len(set(types)) and all(0 < t < 256 for t in types)
    assert not set(types) & set(range(17, 22))   # mode ps's, retired: never to mean something else


@pytest.mark.parametrize("family", sorted(DECODERS))
def test_a_message_of_another_family_is_refused_as_such(family):
    decode, error = DECODERS[family]
    for other, raw in ONE_OF_EACH.items():
        if other == family:
            decode(raw)
            continue
        if family == "state":   # fixed size: padded to it, so that the type is what is wrong
            raw = (raw + bytes(pm.STATE_SIZE))[:pm.STATE_SIZE]
        with pytest.raises(error, match=f"is a {other} message"):
            decode(raw)


def test_bad_magic_version_and_size_are_typed_and_say_what():
    raw = ONE_OF_EACH["fl"]
    for bad, why in [(b"XXXX" + raw[4:], "bad magic"), (raw[:4] + b"\x09" + raw[5:], "version 9"),
                     (raw[:5], "shorter than the 8-byte envelope")]:
        with pytest.raises(DecodeError, match=why):
            envelope.unpack(bad, "fl")
    with pytest.raises(StateMessageError) as err:
        envelope.unpack(raw, "state", StateMessageError)
    assert err.value.reason == "type"


def test_no_message_grew_a_byte():
    """The sizes before the envelope was one (each family had an 8-byte header of its own; geo's
    20 with round, dim and count; a frame's 37 with its name length; a state message 46 bytes):
    emu charges bytes, so a byte more would have moved every virtual time and pin."""
    assert len(ONE_OF_EACH["fl"]) == 8 + 26
    assert len(ONE_OF_EACH["state"]) == pm.STATE_SIZE == 46
    assert len(ONE_OF_EACH["geo"]) == gp.HEADER_SIZE + 16 == 20 + 16
    assert len(ONE_OF_EACH["ddp"]) == 37 + len("dense") + 4
