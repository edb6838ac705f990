"""real.shm: same-host payloads through shared-memory pools beside DDS (loopback profile).

The pool itself needs no DDS; the transport tests run on 127.0.0.1 only, each on a domain of
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


def ref_to(pool: shm.Pool, dst: str, data: bytes, wait_s: float = 0.5) -> bytes:
    return shm.encode_ref([(dst, pool.name, *pool.put(data, wait_s))])


@pytest.fixture
def pair():
    pool, slots = shm.Pool("a", "b", slots=4, slot_bytes=256 << 10), shm.Slots("b")
    yield pool, slots
    pool.close()
    slots.close()


def test_a_payload_goes_through_a_slot_and_the_slot_comes_back(pair):
    pool, slots = pair
    for i in range(40):   # 40 payloads through 4 slots, copied out: never waits
        data = payload(100_000 + 3_000 * i, seed=i)
        assert slots.resolve("a", ref_to(pool, "b", data)) == data
    assert pool.drained()


def test_the_sender_waits_for_a_slot_then_gives_up_until_one_is_free(pair):
    pool, slots = pair
    refs = [ref_to(pool, "b", payload(200_000, seed=i)) for i in range(4)]   # every slot
    t0 = time.monotonic()
    with pytest.raises(shm.PoolFull):
        pool.put(payload(1000), wait_s=0.05)   # nobody reads: a bounded wait, then inline
    assert 0.05 <= time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    with pytest.raises(shm.PoolFull):
        pool.put(payload(1000), wait_s=5.0)    # and no new wait while the pool is still full
    assert time.monotonic() - t0 < 0.5
    assert not pool.drained()
    assert slots.resolve("a", refs[2]) == payload(200_000, seed=2)   # any slot, in any order
    pool.put(payload(1000), wait_s=0.05)
    with pytest.raises(shm.PoolFull):
        pool.put(payload(300_000), wait_s=0.0)   # larger than a slot: never fits


def test_views_hold_their_own_slot_only_and_at_most_half_the_pool(pair):
    pool, slots = pair
    data = [payload(100_000, seed=i) for i in range(4)]
    got = [slots.resolve("a", ref_to(pool, "b", d), view=True) for d in data]
    assert [bytes(g) for g in got] == data
    assert [isinstance(g, np.ndarray) for g in got] == [True, True, False, False]   # half the slots lent
    assert not got[0].flags.writeable
    ref = ref_to(pool, "b", b"x" * 70_000)   # the two copied slots are free again
    assert slots.resolve("a", ref) == b"x" * 70_000
    del got[1]                               # a view let go frees its slot, not the others
    assert (pool._state != 0).sum() == 1
    mv = memoryview(got[0])[10:]             # what is made from a view keeps its slot
    del got[0]
    assert (pool._state != 0).sum() == 1
    del mv
    assert pool.drained()


def test_references_that_do_not_hold_up_are_refused(pair):
    pool, slots = pair
    data = payload(70_000)
    slot, n, token = pool.put(data, 0.1)
    bad = [
        shm.encode_ref([("b", pool.name, slot, n, token ^ 1)]),            # a guessed token
        shm.encode_ref([("b", pool.name, slot + 1, n, token)]),            # another slot
        shm.encode_ref([("b", pool.name, 99, n, token)]),                  # no such slot
        shm.encode_ref([("b", pool.name, slot, 1 << 30, token)]),          # larger than a slot
        shm.encode_ref([("c", pool.name, slot, n, token)]),                # for another node
        shm.encode_ref([("b", "dtemu-shm-0-1-0123456789abcdef", slot, n, token)]),   # no such pool
        shm.encode_ref([("b", "../../etc/passwd", slot, n, token)]),       # not a pool name
        b"\x01\x00\x00\x00\xff",                                          # truncated
    ]
    for ref in bad:
        with pytest.raises(ValueError):
            slots.resolve("a", ref)
    with pytest.raises(ValueError):   # a pool from a to b, claimed by another sender
        slots.resolve("z", shm.encode_ref([("b", pool.name, slot, n, token)]))
    other = shm.Slots("c")   # a pool between a and b is not c's to read
    try:
        with pytest.raises(ValueError):
            other.resolve("a", shm.encode_ref([("c", pool.name, slot, n, token)]))
    finally:
        other.close()
    good = shm.encode_ref([("b", pool.name, slot, n, token)])
    assert slots.resolve("a", good) == data
    with pytest.raises(ValueError):   # a replay: the slot is free (or holds something else)
        slots.resolve("a", good)


def test_a_broadcast_reference_names_every_reader():
    pb, pc = shm.Pool("a", "b", slots=2), shm.Pool("a", "c", slots=2)
    readers = shm.Slots("b"), shm.Slots("c")
    try:
        data = payload(200_000)
        ref = shm.encode_ref([("b", pb.name, *pb.put(data, 0.1)), ("c", pc.name, *pc.put(data, 0.1))])
        assert [r.resolve("a", ref) for r in readers] == [data, data]
    finally:
        for x in (pb, pc, *readers):
            x.close()


def test_pools_of_dead_senders_are_swept():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stale = os.path.join(shm.SHM_DIR, f"{shm.PREFIX}{os.geteuid()}-{dead}-{'0' * 16}")
    with open(stale, "wb") as f:
        f.write(b"x")
    pool = shm.Pool("a", "b", slots=2)   # creating a pool sweeps
    try:
        assert not os.path.exists(stale)
        assert os.path.exists(pool.path)
    finally:
        pool.close()
    assert not os.path.exists(pool.path)


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


def test_large_messages_go_through_pools_small_ones_inline():
    a, b, c = trio(new_domain())
    try:
        big, small = payload(3_000_000, seed=1), payload(1000, seed=2)
        a.send(COLL_FRAMES, big, to=b.node)      # addressed: one pool
        a.send(COLL_FRAMES, small, to=b.node)
        a.send(COLL_FRAMES, big)                 # to everyone: a pool per reader, one reference
        got_b = [b.recv([COLL_FRAMES], timeout_s=10) for _ in range(3)]
        got_c = c.recv([COLL_FRAMES], timeout_s=10)
        assert [bytes(m.data) for m in got_b] == [big, small, big] and bytes(got_c.data) == big
        frames = -(-len(big) // a.frame_bytes)   # 1 MiB frames, each through a slot
        assert a.stats["shm_sent_frames"] == 2 * frames and a.stats["shm_fallbacks"] == 0
        assert b.stats["shm_recv_frames"] == 2 * frames and c.stats["shm_recv_frames"] == frames
        assert b.stats["malformed"] == c.stats["malformed"] == 0
        pools = [p.path for p in a._pools.values()]
        assert len(pools) == 3 and all(os.path.exists(p) for p in pools)
    finally:
        for t in (a, b, c):
            t.close()
    assert not any(os.path.exists(p) for p in pools)   # unlinked by their sender


def test_a_full_pool_sends_inline(monkeypatch):
    a, b, c = trio(new_domain())
    try:
        def full(self, data, wait_s):
            raise shm.PoolFull("test")
        monkeypatch.setattr(shm.Pool, "put", full)
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
        # a sealed run sends inline (a reference is not authenticated): no pool is used
        assert a.stats["shm_sent_frames"] == (0 if sealed else 1)
    finally:
        for t in (a, b, c):
            t.close()


def test_pools_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("DTEMU_DDS_SHM", "0")
    a, b, c = trio(new_domain())
    try:
        big = payload(2_000_000)
        a.send(COLL_FRAMES, big, to=b.node)
        assert b.recv([COLL_FRAMES], timeout_s=10).data == big
        assert a.stats["shm_sent_frames"] == 0 and not a._pools
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


@pytest.mark.parametrize("sealed", [False, True])
def test_a_message_given_as_pieces_arrives_whole(sealed):
    from dtemu.core.runtime.requests import Buffers
    a, b, c = trio(new_domain(), key=b"k" * 32 if sealed else None)
    try:
        head, body = b"header", payload(900_000)
        a.send(COLL_FRAMES, Buffers(head, body), to=b.node)       # one frame: straight into a slot
        a.send(COLL_FRAMES, Buffers(head, body * 3), to=b.node)   # several frames: joined first
        got = [b.recv([COLL_FRAMES], timeout_s=10) for _ in range(2)]
        assert [bytes(m.data) for m in got] == [head + body, head + body * 3]
        assert a.stats["sent_bytes"] == 4 * len(body) + 2 * len(head)
        assert a.stats["shm_sent_frames"] == (0 if sealed else 1 + 3)
    finally:
        for t in (a, b, c):
            t.close()


def test_buffers_count_and_join_their_pieces():
    from dtemu.core.runtime.requests import Buffers, joined
    arr = np.arange(5, dtype=np.float32)
    buf = Buffers(b"ab", memoryview(arr))
    assert len(buf) == 2 + 20 and bytes(buf) == b"ab" + arr.tobytes() == joined(buf)
    assert joined(b"xy") == b"xy"
