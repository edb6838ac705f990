"""real.shm: same-host payloads through shared-memory rings beside DDS (loopback profile).

The ring itself needs no DDS; the transport tests run on 127.0.0.1 only, each on a domain of
its own, with bounded waits.
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from dtemu.real import shm

pytestmark = pytest.mark.skipif(not shm.enabled("loopback", False) and os.environ.get("DTEMU_DDS_SHM") is None,
                                reason="no /dev/shm or not x86-64")


def payload(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def ref_to(ring: shm.Ring, dst: str, data: bytes, wait_s: float = 0.5) -> bytes:
    ref = shm.encode_ref([(dst, ring.name, *ring.put(data, wait_s))])
    ring.referenced()
    return ref


@pytest.fixture
def pair():
    ring, rings = shm.Ring("a", "b", capacity=1 << 20), shm.Rings("b")
    yield ring, rings
    ring.close()
    rings.close()


def test_a_payload_goes_through_the_ring_and_its_room_comes_back(pair):
    ring, rings = pair
    for i in range(40):   # 40 x 100-300 kB through a 1 MiB ring: wraps many times, never waits
        data = payload(100_000 + 5_000 * i, seed=i)
        assert rings.resolve("a", ref_to(ring, "b", data)) == data
    assert ring.drained()


def test_the_sender_waits_for_room_then_gives_up(pair):
    ring, rings = pair
    refs = [ref_to(ring, "b", payload(300_000, seed=i)) for i in range(3)]   # 0.9 MiB of 1 MiB
    t0 = time.monotonic()
    with pytest.raises(shm.RingFull):
        ring.put(payload(300_000), wait_s=0.05)   # nobody reads: bounded wait, then inline
    assert 0.05 <= time.monotonic() - t0 < 1.0
    assert not ring.drained()
    assert rings.resolve("a", refs[0]) == payload(300_000, seed=0)   # the reader frees one slot
    ring.put(payload(300_000), wait_s=0.05)
    with pytest.raises(shm.RingFull):
        ring.put(payload(2 << 20), wait_s=0.0)   # larger than the ring: never fits


def test_references_that_do_not_hold_up_are_refused(pair, tmp_path):
    ring, rings = pair
    data = payload(70_000)
    pos, n, token = ring.put(data, 0.1)
    bad = [
        shm.encode_ref([("b", ring.name, pos, n, token ^ 1)]),             # a guessed token
        shm.encode_ref([("b", ring.name, pos, n + 1, token)]),             # the wrong length
        shm.encode_ref([("c", ring.name, pos, n, token)]),                 # for another node
        shm.encode_ref([("b", "dtemu-shm-0-1-0123456789abcdef", pos, n, token)]),   # no such ring
        shm.encode_ref([("b", "../../etc/passwd", pos, n, token)]),        # not a ring name
        shm.encode_ref([("b", ring.name, ring.capacity - 10, n, token)]),  # past the end
        b"\x01\x00\x00\x00\xff",                                           # truncated
    ]
    for ref in bad:
        with pytest.raises(ValueError):
            rings.resolve("a", ref)
    with pytest.raises(ValueError):   # a ring from a to b, claimed by another sender
        rings.resolve("z", shm.encode_ref([("b", ring.name, pos, n, token)]))
    good = shm.encode_ref([("b", ring.name, pos, n, token)])
    assert rings.resolve("a", good) == data
    with pytest.raises(ValueError):   # a replay: behind the read position
        rings.resolve("a", good)
    other = shm.Rings("c")   # a ring between a and b is not c's to read
    try:
        with pytest.raises(ValueError):
            other.resolve("a", shm.encode_ref([("c", ring.name, pos, n, token)]))
    finally:
        other.close()


def test_a_broadcast_reference_names_every_reader():
    rb, rc = shm.Ring("a", "b", capacity=1 << 20), shm.Ring("a", "c", capacity=1 << 20)
    readers = shm.Rings("b"), shm.Rings("c")
    try:
        data = payload(200_000)
        ref = shm.encode_ref([("b", rb.name, *rb.put(data, 0.1)), ("c", rc.name, *rc.put(data, 0.1))])
        assert [r.resolve("a", ref) for r in readers] == [data, data]
    finally:
        for x in (rb, rc, *readers):
            x.close()


def test_rings_of_dead_senders_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = os.path.join(shm.SHM_DIR, f"{shm.PREFIX}{os.geteuid()}-{dead}-{'0' * 16}")
    with open(stale, "wb") as f:
        f.write(b"x")
    ring = shm.Ring("a", "b", capacity=1 << 20)   # creating a ring sweeps
    try:
        assert not os.path.exists(stale)
        assert os.path.exists(ring.path)
    finally:
        ring.close()
    assert not os.path.exists(ring.path)


# --- through the transport -------------------------------------------------------------------

cyclonedds = pytest.importorskip("cyclonedds")

from helpers import new_domain  # noqa: E402
from dtemu.core.wire.topics import COLL_FRAMES  # noqa: E402
from dtemu.real.transport import DdsTransport  # noqa: E402
from dtemu.real.wire import encode_parts  # noqa: E402

PID = os.getpid()


def trio(domain, key=None):
    names = [f"{x}-{PID}" for x in "abc"]
    ts = [DdsTransport(n, domain_id=domain, subscribe=[COLL_FRAMES], key=key) for n in names]
    for t in ts:
        assert t.wait_matched({COLL_FRAMES: [n for n in names if n != t.node]}, timeout_s=10) == {}
    return ts


def test_large_messages_go_through_rings_small_ones_inline():
    a, b, c = trio(new_domain())
    try:
        big, small = payload(3_000_000, seed=1), payload(1000, seed=2)
        a.send(COLL_FRAMES, big, to=b.node)      # addressed: one ring
        a.send(COLL_FRAMES, small, to=b.node)
        a.send(COLL_FRAMES, big)                 # to everyone: a ring per reader, one reference
        got_b = [b.recv([COLL_FRAMES], timeout_s=10) for _ in range(3)]
        got_c = c.recv([COLL_FRAMES], timeout_s=10)
        assert [m.data for m in got_b] == [big, small, big] and got_c.data == big
        assert a.stats["shm_sent_frames"] == 2 and a.stats["shm_fallbacks"] == 0
        assert b.stats["shm_recv_frames"] == 2 and c.stats["shm_recv_frames"] == 1
        assert b.stats["malformed"] == c.stats["malformed"] == 0
        rings = [r.path for r in a._rings.values()]
        assert len(rings) == 3 and all(os.path.exists(p) for p in rings)
    finally:
        for t in (a, b, c):
            t.close()
    assert not any(os.path.exists(p) for p in rings)   # unlinked by their sender


def test_a_full_ring_sends_inline(monkeypatch):
    a, b, c = trio(new_domain())
    try:
        def full(self, data, wait_s):
            raise shm.RingFull("test")
        monkeypatch.setattr(shm.Ring, "put", full)
        big = payload(2_000_000)
        a.send(COLL_FRAMES, big, to=b.node)
        assert b.recv([COLL_FRAMES], timeout_s=10).data == big
        assert a.stats["shm_fallbacks"] >= 1 and a.stats["shm_sent_frames"] == 0
    finally:
        for t in (a, b, c):
            t.close()


@pytest.mark.parametrize("sealed", [False, True])
def test_a_forged_reference_is_counted_and_changes_nothing(sealed):
    a, b, c = trio(new_domain(), key=b"k" * 32 if sealed else None)
    try:
        forged = shm.encode_ref([(b.node, "dtemu-shm-0-1-0123456789abcdef", 0, 100_000, 7)])
        c._write(c._writer(COLL_FRAMES), encode_parts(a.node, b.node, COLL_FRAMES, 1, 0, 1 | shm.SHM_FLAG,
                                                      100_000, forged, pad4=True))
        big = payload(500_000)
        a.send(COLL_FRAMES, big, to=b.node)
        assert b.recv([COLL_FRAMES], timeout_s=10).data == big
        assert b.stats["malformed"] == 1 and b.stats["errors"] == 0
        # a sealed run sends inline (a reference is not authenticated): the ring is never used
        assert a.stats["shm_sent_frames"] == (0 if sealed else 1)
    finally:
        for t in (a, b, c):
            t.close()


def test_rings_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("DTEMU_DDS_SHM", "0")
    a, b, c = trio(new_domain())
    try:
        big = payload(2_000_000)
        a.send(COLL_FRAMES, big, to=b.node)
        assert b.recv([COLL_FRAMES], timeout_s=10).data == big
        assert a.stats["shm_sent_frames"] == 0 and not a._rings
    finally:
        for t in (a, b, c):
            t.close()


def test_a_late_joiner_gets_a_large_model_inline():
    from dtemu.core.wire.topics import MODEL_BLOB
    domain = new_domain()
    with DdsTransport(f"srv-{PID}", domain_id=domain) as srv:
        blob = payload(1_500_000)
        srv.send(MODEL_BLOB, blob)   # before anyone reads it: the writer's history keeps it
        with DdsTransport(f"late-{PID}", domain_id=domain, subscribe=[MODEL_BLOB]) as late:
            assert late.recv([MODEL_BLOB], timeout_s=10).data == blob
        assert srv.stats["shm_sent_frames"] == 0
