"""Collectives: frames in any order, interleaved, malformed; allgather, allreduce, barrier in emu."""

import random

import numpy as np
import pytest
import simpy
from hypothesis import given, settings, strategies as st

from dtemu.core.ddp.collectives import COLL_FRAMES, Collective, CollectiveTimeout, FrameError, mean32_in_rank_order
from dtemu.core.ddp.frames import Frame, decode_frame, encode_frame, split_payload
from dtemu.core.runtime.requests import Message, Recv, RecordingContext, Send
from dtemu.core.runtime.compute import ComputeTimer
from dtemu.emu.network import Network, link_from_spec
from dtemu.emu.world import EmuNode, World
from dtemu.core.runtime.compute_spec import ComputeSpec


def frames_of(rank, world, round_, name, payload, frame_bytes, part=0, group=0):
    chunks = split_payload(payload, frame_bytes)
    return [encode_frame(Frame(group, round_, name, part, rank, world, i, len(chunks), len(payload), c))
            for i, c in enumerate(chunks)]


def drive(gen, inbox):
    """Run a generator that only Recv's (and Send's), answering from ``inbox``."""
    value = None
    while True:
        try:
            req = gen.send(value)
        except StopIteration as stop:
            return stop.value
        if isinstance(req, Recv):
            value = Message(COLL_FRAMES, "peer", inbox.pop(0)) if inbox else None
        elif isinstance(req, Send):
            value = 1
        else:
            raise AssertionError(req)


def test_frames_in_any_order_and_interleaved_reassemble():
    world, rng = 3, random.Random(5)
    payloads = {(r, name, rank): bytes(rng.getrandbits(8) for _ in range(1000 + 37 * rank))
                for r in (7, 8) for name in ("grad", "eval") for rank in (1, 2)}
    frames = [f for (r, name, rank), p in payloads.items() for f in frames_of(rank, world, r, name, p, 100)]
    rng.shuffle(frames)
    coll = Collective(RecordingContext(), 0, ["w0", "w1", "w2"], frame_bytes=100)
    handle = drive(coll.start_allgather(8, "grad", b"mine"), [])
    drive(coll.wait(handle, deadline=None), frames)
    got = coll.collect(handle)
    assert got == [b"mine", payloads[(8, "grad", 1)], payloads[(8, "grad", 2)]]
    # the other collectives' frames were kept, not lost (and the rest are still to come)
    other = drive(coll.start_allgather(7, "eval", b"x"), [])
    drive(coll.wait(other, deadline=None), frames)
    assert coll.collect(other)[2] == payloads[(7, "eval", 2)]


def test_malformed_and_stale_frames_are_counted_not_fatal():
    ctx = RecordingContext()
    coll = Collective(ctx, 0, ["w0", "w1"], frame_bytes=64)
    good = frames_of(1, 2, 1, "grad", b"a" * 100, 64)
    bad = [b"junk", good[0][:10], encode_frame(Frame(0, 1, "grad", 0, 5, 2, 0, 1, 3, b"abc")),
           encode_frame(Frame(0, 1, "grad", 0, 1, 2, 3, 2, 100, b"x"))]
    handle = drive(coll.start_allgather(1, "grad", b"b" * 100), [])
    drive(coll.wait(handle, None), bad + good)
    assert coll.collect(handle)[1] == b"a" * 100
    assert coll.counts["malformed"] == 4
    assert len([e for e in ctx.events if e["kind"] == "frame_rejected"]) == 4
    coll._file(Message(COLL_FRAMES, "w1", good[0]))  # a late duplicate of a finished round
    assert coll.counts["stale"] == 1


def _lent(frame: bytes) -> Message:
    """A frame as real mode lends it (real.shm's slot, real.stream's receive buffer): a read-only array."""
    arr = np.frombuffer(bytearray(frame), np.uint8)
    arr.flags.writeable = False
    return Message(COLL_FRAMES, "w1", memoryview(arr))


def test_lent_frames_are_copied_into_their_place_once_and_not_held():
    import weakref

    payload = bytes(range(256)) * 4 + b"tail"
    frames = frames_of(1, 2, 1, "grad", payload, 100)
    coll = Collective(RecordingContext(), 0, ["w0", "w1"], frame_bytes=100)
    handle = drive(coll.start_allgather(1, "grad", b"mine"), [])
    lent = [_lent(f) for f in frames]
    held = [weakref.ref(m.data.obj) for m in lent]
    order = [3, 0, len(frames) - 1, *range(1, len(frames) - 1)]   # the last (short) frame early
    for i in order:
        if i in (1, 2):   # a few come as immutable messages (inline in DDS), the rest lent
            coll._file(Message(COLL_FRAMES, "w1", frames[i]))
        else:
            coll._file(lent[i])
    del lent
    assert all(ref() is None for ref in held[3:])   # no lent buffer is held by the assembly
    got = coll.collect(handle)[1]
    assert got == payload and not isinstance(got, bytes)   # the buffer it was copied into, not a join
    assert coll.counts["malformed"] == 0


def test_a_frame_that_does_not_fit_its_payload_s_cut_is_refused_and_changes_nothing():
    ctx = RecordingContext()
    coll = Collective(ctx, 0, ["w0", "w1"], frame_bytes=64)
    good = frames_of(1, 2, 1, "grad", b"a" * 64 + b"b" * 64 + b"c" * 10, 64)
    odd = [encode_frame(Frame(0, 1, "grad", 0, 1, 2, 1, 3, 138, b"x" * 60)),   # shorter than frame 0
           encode_frame(Frame(0, 1, "grad", 0, 1, 2, 2, 3, 138, b"y" * 12)),   # a last frame of 12, not 10
           encode_frame(Frame(0, 1, "grad", 1, 1, 2, 1, 3, 138, b"z" * 30))]   # (another part) 3 x 30 < 138
    handle = drive(coll.start_allgather(1, "grad", b"mine"), [])
    coll._file(_lent(good[0]))
    for f in odd:
        coll._file(_lent(f))
    assert coll.counts["malformed"] == 3
    for f in good[1:]:
        coll._file(_lent(f))
    assert coll.collect(handle)[1] == b"a" * 64 + b"b" * 64 + b"c" * 10


def test_declared_sizes_are_bounded_before_allocation():
    huge = encode_frame(Frame(0, 1, "grad", 0, 1, 2, 0, 1, 2**40, b""))
    with pytest.raises(FrameError, match="more than"):
        decode_frame(huge, world=2, max_total=1 << 20)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=120), st.integers(0, 80), st.integers(0, 255))
def test_decode_frame_only_raises_frame_error(noise, pos, value):
    frame = bytearray(encode_frame(Frame(0, 3, "grad", 0, 1, 4, 0, 1, 5, b"hello")))
    frame[pos % len(frame)] = value
    for data in (noise, bytes(frame)):
        try:
            decode_frame(data, world=4, max_total=1 << 20)
        except FrameError:
            pass


def test_wait_times_out_naming_missing_ranks():
    coll = Collective(RecordingContext(), 0, ["w0", "w1", "w2"])
    handle = drive(coll.start_allgather(1, "grad", b"x"), [])
    with pytest.raises(CollectiveTimeout) as info:
        drive(coll.wait(handle, deadline=5.0), frames_of(2, 3, 1, "grad", b"y", 10))
    assert info.value.missing == [1]


# --- in the emulator --------------------------------------------------------

def emu_world(names, role, up_mbps=100.0, down=()):
    env = simpy.Environment()
    net = Network(env, {n: link_from_spec(up_mbps, up_mbps, 1.0, 0.0) for n in names})
    events = []
    world = World(env, net, events.append, lambda data: "none")
    timer = ComputeTimer(ComputeSpec(train_s_per_sample=0.001), None, seed=0)
    for rank, name in enumerate(names):
        world.add(EmuNode(world, name, rank, (COLL_FRAMES,), lambda ctx, r=rank: role(ctx, r), timer))
    procs = {}
    for name in names:
        if name in down:
            net.fail_node(name)
        else:
            procs[name] = world.start(name)
    return env, procs, events


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_ring_and_gather_allreduce_agree(world_size):
    names = [f"w{i}" for i in range(world_size)]
    vecs = [np.random.default_rng(i).standard_normal(1001).astype(np.float32) for i in range(world_size)]
    results = {}

    def role(ctx, rank):
        coll = Collective(ctx, rank, names, frame_bytes=1 << 16)
        yield from coll.barrier(deadline=10)
        gather, g_sent = yield from coll.allreduce_mean(1, vecs[rank], 10.0, "gather")
        ring, r_sent = yield from coll.allreduce_mean(2, vecs[rank], 20.0, "ring")
        results[rank] = (gather, ring, g_sent, r_sent)

    env, procs, _ = emu_world(names, role)
    env.run(until=env.all_of(list(procs.values())))
    expected = np.mean(vecs, axis=0)
    for rank, (gather, ring, g_sent, r_sent) in results.items():
        np.testing.assert_allclose(gather, expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ring, expected, rtol=1e-5, atol=1e-6)
        assert gather.tobytes() == results[0][0].tobytes() and ring.tobytes() == results[0][1].tobytes()
        # gather sends the vector to W-1 peers, the ring 2(W-1)/W of it
        assert g_sent == pytest.approx(4004 * (world_size - 1), rel=0.05)
        assert r_sent == pytest.approx(4004 * 2 * (world_size - 1) / world_size, rel=0.1)


def test_barrier_reports_the_missing_rank():
    names = ["w0", "w1", "w2"]
    errors = {}

    def role(ctx, rank):
        coll = Collective(ctx, rank, names)
        try:
            yield from coll.barrier(deadline=3.0)
        except CollectiveTimeout as err:
            errors[rank] = (err.missing, ctx.now())

    env, procs, _ = emu_world(names, role, down=("w2",))
    env.run(until=env.all_of(list(procs.values())))
    assert errors == {0: ([2], 3.0), 1: ([2], 3.0)}


@pytest.mark.parametrize("world_size,n,piece_bytes", [(2, 1001, 400), (3, 1001, 400), (3, 2, 400), (5, 10_000, 4096)])
def test_pipelined_allreduce_is_the_float32_rank_order_mean_on_every_rank(world_size, n, piece_bytes):
    names = [f"w{i}" for i in range(world_size)]
    vecs = [np.random.default_rng(i).standard_normal(n).astype(np.float32) * 10 ** i for i in range(world_size)]
    results = {}

    def role(ctx, rank):
        coll = Collective(ctx, rank, names, frame_bytes=1 << 16, piece_bytes=piece_bytes)
        yield from coll.barrier(deadline=10)
        for step in (1, 2):  # twice: the second round's frames must not mix with the first's
            mean, sent = yield from coll.allreduce_mean(step, vecs[rank], 10.0 * step, "pipelined")
        results[rank] = (mean, sent, dict(coll.counts), len(coll._done))

    env, procs, _ = emu_world(names, role)
    env.run(until=env.all_of(list(procs.values())))
    expected = mean32_in_rank_order(vecs)
    for rank, (mean, sent, counts, left) in results.items():
        assert mean.tobytes() == expected.tobytes()  # bit for bit, on every rank
        assert counts == {"malformed": 0, "stale": 0} and left == 0
        # 2(W-1)/W of the vector, as the ring
        assert sent == pytest.approx(4 * n * 2 * (world_size - 1) / world_size, rel=0.2, abs=400)
    # float32 in rank order is not the float64 mean, but close to it
    np.testing.assert_allclose(expected, np.mean(vecs, axis=0), rtol=1e-4, atol=1e-3)


def test_pipelined_piece_of_the_wrong_size_is_refused_not_fatal():
    ctx = RecordingContext()
    coll = Collective(ctx, 0, ["w0", "w1"], piece_bytes=1 << 20)
    mine = np.arange(6, dtype=np.float32)
    # rank 1's piece of rank 0's shard (floats 0..2) is 8 bytes, not 12; its own shard is fine
    inbox = [encode_frame(Frame(0, 1, "prs", 0, 1, 2, 0, 1, 8, b"\0" * 8)),
             encode_frame(Frame(0, 1, "pag", 0, 1, 2, 0, 1, 12, np.full(3, 7, np.float32).tobytes()))]
    with pytest.raises(CollectiveTimeout) as info:
        drive(coll.allreduce_mean(1, mine, 5.0, "pipelined"), inbox)
    assert info.value.missing == [1]
    assert coll.counts["malformed"] == 1
    assert [e["kind"] for e in ctx.events] == ["frame_rejected"]
    # a good round afterwards goes through
    inbox = [encode_frame(Frame(0, 2, "prs", 0, 1, 2, 0, 1, 12, np.ones(3, np.float32).tobytes())),
             encode_frame(Frame(0, 2, "pag", 0, 1, 2, 0, 1, 12, np.full(3, 7, np.float32).tobytes()))]
    mean, _ = drive(coll.allreduce_mean(2, mine, None, "pipelined"), inbox)
    assert mean.tolist() == [0.5, 1.0, 1.5, 7, 7, 7]
