"""real.reassembly without DDS: a flood of forged or replayed frames cannot evict an honest message."""

import os

import pytest

from dtemu.core.wire import frame_auth
from dtemu.real.reassembly import Reassembler
from dtemu.real.wire import Frame

TOPIC = "train/client_update"
KEY = bytes(range(32))


def frames(src, msg_id, data, parts, key=None, dst=""):
    """The frames of one message as DdsTransport.send cuts them."""
    size = -(-len(data) // parts)
    out = []
    for i in range(parts):
        chunk = data[i * size:(i + 1) * size]
        if key is not None:
            chunk = frame_auth.frame_tag(frame_auth.frame_key(key), TOPIC, src, dst, TOPIC, msg_id, i, parts,
                                         len(data), chunk) + chunk
        out.append(Frame(src=src, dst=dst, topic=TOPIC, msg_id=msg_id, part=i, parts=parts, total=len(data),
                         payload=memoryview(chunk)))
    return out


def feed(r, fs):
    for f in fs:
        r._on_frame(TOPIC, f, 0)


def forged_part0(src, msg_id, n=100):
    return Frame(src=src, dst="", topic=TOPIC, msg_id=msg_id, part=0, parts=2, total=2 * n,
                 payload=memoryview(os.urandom(n)))


@pytest.mark.parametrize("sealed", [True, False])
def test_replayed_and_repeated_frames_do_not_evict_a_message_in_flight(sealed):
    key = KEY if sealed else None
    r = Reassembler("controller", key=key)
    old = frames("client1", 10, b"a" * 300, 3, key)
    new = frames("client1", 11, b"b" * 300, 3, key)
    feed(r, old)
    feed(r, new[:2])
    feed(r, old[:1] * 50 + new[:2] * 50)  # replays of an older message, repeats of the current one
    feed(r, new[2:])
    assert [m.data for m in r.delivered] == [b"a" * 300, b"b" * 300]
    assert r.stats["replayed_frames"] == 50 and r.stats["duplicate_frames"] == 100
    assert r.stats["incomplete_dropped"] == 0


def test_with_a_key_forged_fragments_in_an_honest_name_never_touch_its_message():
    r = Reassembler("controller", key=KEY)
    honest = frames("client1", 20, os.urandom(3000), 5, KEY)
    for i, f in enumerate(honest):
        feed(r, [forged_part0("client1", 21 + 100 * i + j) for j in range(100)])  # newer ids, no valid tag
        feed(r, [f])
    assert len(r.delivered) == 1 and r.delivered[0].data == b"".join(bytes(f.payload[16:]) for f in honest)
    assert r.stats["forged_frames"] == 500 and r.stats["incomplete_dropped"] == 0


def test_a_frame_signed_with_another_key_is_forged():
    r = Reassembler("controller", key=KEY)
    feed(r, frames("client1", 1, b"x" * 10, 1, key=b"another key of 32 bytes........."))
    assert r.delivered == [] and r.stats["forged_frames"] == 1


def test_without_a_key_forged_fragments_can_evict_but_nothing_breaks():
    """Unsealed, anyone on the domain can speak in any name (docs/design.md says so)."""
    r = Reassembler("controller")
    honest = frames("client1", 20, b"y" * 300, 3)
    feed(r, honest[:1] + [forged_part0("client1", 21)] + honest[1:])
    assert r.delivered == [] and r.stats["incomplete_dropped"] == 1


def test_remembered_senders_are_bounded():
    r = Reassembler("controller")
    for i in range(5000):
        feed(r, frames(f"made-up-{i}", 1, b"z", 1))
    assert len(r._last_id) == 4096 and len(r.delivered) == 5000
