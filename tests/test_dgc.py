"""Deep Gradient Compression: selection, momentum correction and masking,
conservation, warm-up, clipping, the wire bucket, averaging and DGCSGD."""

import itertools
import math
import struct
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtemu.core.wire.bucket import (
    ENTRY,
    ENTRY_SIZE,
    HEADER_SIZE,
    Bucket,
    TensorPayload,
    bucket_size,
    decode_bucket,
    encode_bucket,
)
from dtemu.core.compression.codecs import topk_count
from dtemu.core.compression.dgc import (
    DGCSGD,
    DGCCompressor,
    DGCConfig,
    average_buckets,
    check_bucket,
    param_shapes,
    select_indices,
)
from dtemu.core.errors import DecodeError, FrameError, RejectedUpdate

# examples/mnist's Net, as core.models.MnistCnn builds it.
MNIST_SHAPES = [
    ("conv1.weight", (32, 1, 3, 3)),
    ("conv1.bias", (32,)),
    ("conv2.weight", (64, 32, 3, 3)),
    ("conv2.bias", (64,)),
    ("fc1.weight", (128, 9216)),
    ("fc1.bias", (128,)),
    ("fc2.weight", (10, 128)),
    ("fc2.bias", (10,)),
]
MODEL_DIM = 1_199_882
DENSE_BYTES = 4 * MODEL_DIM
SMALL_SHAPES = [("w", (6, 5)), ("b", (3,)), ("v", (40,))]  # for fuzzing: w and v sparse


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These tensors are too small to gain from threads; on a loaded 2-core
    machine a second thread only waits for its time slice."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def grads_for(shapes, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) * scale for _, shape in shapes]


def flat_sent(payload):
    return payload.to_dense().double()


# ------------------------------------------------------------------ model and config


def test_mnist_shapes_are_the_model_s():
    from dtemu.core.ml.models import build_model

    shapes = param_shapes(build_model("mnist_cnn", 0))
    assert shapes == MNIST_SHAPES
    assert sum(math.prod(s) for _, s in shapes) == MODEL_DIM


def test_kinds_follow_dense_below_and_the_baseline():
    D, S = 0, 1
    assert DGCConfig().kinds(MNIST_SHAPES) == [D, D, S, D, S, D, S, D]  # conv1.weight has 288
    assert DGCConfig(dense_below=0).kinds(MNIST_SHAPES) == [S] * 8
    assert DGCConfig(density=1.0).kinds(MNIST_SHAPES) == [D] * 8


@pytest.mark.parametrize("bad", [
    dict(density=0.0), dict(density=1.5), dict(sample_ratio=0), dict(momentum=1.0),
    dict(momentum=-0.1), dict(nesterov=True, momentum=0.0), dict(clip_norm=0.0),
    dict(clip_norm=math.inf), dict(weight_decay=-1e-4), dict(warmup_densities=(0.5, 0.0)),
    dict(warmup_steps_per_stage=-1), dict(warmup_steps_per_stage=1.5), dict(dense_below=-1),
    dict(seed=-1), dict(density=True),
])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        DGCConfig(**bad)


# ------------------------------------------------------------------ warm-up


def test_warmup_schedule_per_step():
    cfg = DGCConfig(density=0.001, warmup_steps_per_stage=3)
    got = [cfg.density_at(s) for s in range(18)]
    assert got == [0.25] * 3 + [0.0625] * 3 + [0.015625] * 3 + [0.004] * 3 + [0.001] * 6
    assert all(DGCConfig(density=0.001).density_at(s) == 0.001 for s in range(50))
    # A stage never compresses harder than the final density; the baseline stays dense.
    assert DGCConfig(density=0.01, warmup_steps_per_stage=1).density_at(3) == 0.01
    assert DGCConfig(density=1.0, warmup_steps_per_stage=1).density_at(0) == 1.0
    custom = DGCConfig(density=0.01, warmup_densities=(0.5,), warmup_steps_per_stage=10)
    assert [custom.density_at(s) for s in (0, 9, 10)] == [0.5, 0.5, 0.01]
    with pytest.raises(ValueError):
        cfg.density_at(-1)


def test_compressor_sends_the_warmup_stage_budget():
    cfg = DGCConfig(density=0.001, warmup_steps_per_stage=2)
    comp = DGCCompressor(MNIST_SHAPES, cfg, world_size=2, rank=0)
    for step in range(10):
        bucket = comp.compress(grads_for(MNIST_SHAPES, step), step)
        k = topk_count(128 * 9216, cfg.density_at(step))  # fc1.weight
        assert 0.8 * k <= bucket.payloads[4].k <= k


# ------------------------------------------------------------------ selection


def _distribution(name, n, rng):
    if name == "normal":
        return rng.standard_normal(n)
    if name == "heavy":
        return rng.standard_t(1.5, n)
    if name == "sparse":  # most entries zero, as behind dead ReLUs
        return rng.standard_normal(n) * (rng.random(n) < 0.3)
    if name == "scaled_rows":  # magnitudes that differ by row, as in a layer
        return (rng.standard_normal(n).reshape(-1, 128) * rng.lognormal(0, 2, 128)).reshape(-1)
    raise AssertionError(name)


@pytest.mark.parametrize("density", [0.001, 0.004, 0.015625, 0.25])
def test_selection_stays_within_bounds_and_takes_the_largest(density):
    rng = np.random.default_rng(7)
    for (_, shape), dist, trial in itertools.product(
        [s for s in MNIST_SHAPES if math.prod(s[1]) >= 1024], ["normal", "heavy", "sparse", "scaled_rows"], range(3)
    ):
        n = math.prod(shape)
        mag = np.abs(_distribution(dist, n, rng)).astype(np.float32)
        k = topk_count(n, density)
        idx = select_indices(mag, k, density, 0.01, np.random.default_rng([trial, n]))
        assert idx.dtype == np.int64
        assert (np.diff(idx) > 0).all() and idx[0] >= 0 and idx[-1] < n
        nonzero = int(np.count_nonzero(mag))
        assert min(0.8 * k, nonzero) <= len(idx) <= k, (shape, dist, len(idx), k)
        # Whatever the threshold, what is sent is a true top of |v|.
        rest = np.ones(n, bool)
        rest[idx] = False
        assert mag[idx].min() >= mag[rest].max()


def test_selection_of_an_all_zero_tensor_sends_at_most_k():
    idx = select_indices(np.zeros(50_000, np.float32), 50, 0.001, 0.01, np.random.default_rng(0))
    assert len(idx) == 50


def test_compression_is_repeatable():
    def run():
        comp = DGCCompressor(MNIST_SHAPES, DGCConfig(), 4, 1)
        return [encode_bucket(comp.compress(grads_for(MNIST_SHAPES, s), s)) for s in range(3)]

    assert run() == run()


# ------------------------------------------------------------------ momentum correction and masking


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
def test_sent_entries_are_masked(nesterov, fp16):
    comp = DGCCompressor(MNIST_SHAPES, DGCConfig(nesterov=nesterov, fp16_values=fp16), 2, 1)
    for step in range(4):
        bucket = comp.compress(grads_for(MNIST_SHAPES, step), step)
        for i, p in enumerate(bucket.payloads):
            if p.indices is None:
                assert comp.momentum(i) is None and comp.velocity(i) is None
                continue
            assert p.k > 0
            assert not comp.momentum(i)[p.indices].any()
            v = comp.velocity(i)[p.indices]
            if fp16:  # only the fp16 rounding error stays behind
                assert (v.abs() <= p.values.abs() * 2.0**-11).all()
            else:
                assert not v.any()
            # Unsent entries keep accumulating.
            assert comp.velocity(i).count_nonzero() > comp.velocity(i).numel() // 2


# Smaller than the model, still sampled (numel well above 2/density): keeps the test fast.
CONSERVATION_SHAPES = [("conv", (64, 32, 3, 3)), ("bias", (64,)), ("fc", (128, 2304))]


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("nesterov", [False, True])
def test_nothing_is_lost(nesterov, fp16):
    """Sent over time + still accumulated == sum of momentum-corrected gradients."""
    m, shapes = 0.9, CONSERVATION_SHAPES
    cfg = DGCConfig(density=0.01, momentum=m, nesterov=nesterov, fp16_values=fp16)
    comp = DGCCompressor(shapes, cfg, 1, 0)
    sparse = [0, 2]
    meant = {i: torch.zeros(math.prod(shapes[i][1]), dtype=torch.float64) for i in sparse}
    sent = {i: torch.zeros_like(meant[i]) for i in sparse}
    for step in range(12):
        grads = grads_for(shapes, 100 + step)
        u_before = {i: comp.momentum(i).double().clone() for i in sparse}
        bucket = comp.compress(grads, step)
        for i in sparse:
            g = grads[i].reshape(-1).double()
            if nesterov:
                meant[i] += m * (u_before[i] + g) + g
            else:
                meant[i] += m * u_before[i] + g
            sent[i] += flat_sent(bucket.payloads[i])
    for i in sparse:
        assert sent[i].count_nonzero() > 0
        total = sent[i] + comp.velocity(i).double()
        torch.testing.assert_close(total, meant[i], rtol=0, atol=1e-4 * float(meant[i].abs().max()))


def test_non_finite_gradient_is_refused_without_touching_the_state():
    comp = DGCCompressor(MNIST_SHAPES, DGCConfig(), 1, 0)
    comp.compress(grads_for(MNIST_SHAPES, 0), 0)
    before = [comp.velocity(i).clone() for i in (2, 4, 6)]
    bad = grads_for(MNIST_SHAPES, 1)
    bad[4][3, 7] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        comp.compress(bad, 1)
    for i, b in zip((2, 4, 6), before):
        assert torch.equal(comp.velocity(i), b)
    with pytest.raises(ValueError):
        comp.compress(grads_for(MNIST_SHAPES, 1)[:-1], 1)
    with pytest.raises(ValueError):
        comp.compress(grads_for(SMALL_SHAPES, 1) * 3, 1)


# ------------------------------------------------------------------ clipping


def _sent_norm(comp, bucket):
    """Norm of what this step put in: dense payloads + sparse sent + still in v."""
    total = 0.0
    for i, p in enumerate(bucket.payloads):
        x = flat_sent(p)
        if p.indices is not None:
            x = x + comp.velocity(i).double()
        total += float(x @ x)
    return math.sqrt(total)


@pytest.mark.parametrize("world_size", [1, 4, 16])
def test_clipping_scales_by_inverse_sqrt_world_size(world_size):
    grads = grads_for(MNIST_SHAPES, 9)
    norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads))
    assert norm > 100
    for density in (1.0, 0.001):  # the dense baseline and DGC (first step: v = g)
        comp = DGCCompressor(MNIST_SHAPES, DGCConfig(density=density, clip_norm=10.0), world_size, 0)
        bucket = comp.compress(grads, 0)
        assert _sent_norm(comp, bucket) == pytest.approx(10.0 / math.sqrt(world_size), rel=1e-5)
    # Below the threshold the gradient goes through untouched.
    comp = DGCCompressor(MNIST_SHAPES, DGCConfig(density=1.0, clip_norm=2 * norm), 1, 0)
    bucket = comp.compress(grads, 0)
    for g, p in zip(grads, bucket.payloads):
        assert torch.equal(p.values, g.reshape(-1))


# ------------------------------------------------------------------ the wire bucket


def _expected_size(bucket, value_bytes):
    size = 20
    for p in bucket.payloads:
        size += 12 + (p.numel * value_bytes if p.indices is None else p.k * (4 + value_bytes))
    return size


@pytest.mark.parametrize("fp16", [False, True])
def test_bucket_round_trip_and_exact_size(fp16):
    comp = DGCCompressor(MNIST_SHAPES, DGCConfig(fp16_values=fp16, warmup_steps_per_stage=1), 3, 2)
    for step in (0, 4):
        bucket = comp.compress(grads_for(MNIST_SHAPES, step), step)
        data = encode_bucket(bucket)
        assert len(data) == bucket_size(bucket) == _expected_size(bucket, 2 if fp16 else 4)
        back = decode_bucket(data, MNIST_SHAPES, world_size=3)
        assert (back.rank, back.step, back.world_size, back.fp16_values) == (2, step, 3, fp16)
        for a, b in zip(bucket.payloads, back.payloads):
            assert a.numel == b.numel and a.kind == b.kind
            assert torch.equal(a.values, b.values)  # fp16 values are rounded before sending
            assert (a.indices is None and b.indices is None) or torch.equal(a.indices, b.indices)
        assert encode_bucket(back) == data


def test_bucket_bytes_by_hand():
    # fp32 + int32 = 8 bytes per sparse entry, fp16 + int32 = 6.
    payloads = [TensorPayload(30, torch.arange(3.0), torch.tensor([0, 5, 29])),
                TensorPayload(3, torch.ones(3))]
    assert len(encode_bucket(Bucket(0, 1, 1, False, payloads))) == 20 + 12 + 24 + 12 + 12
    assert len(encode_bucket(Bucket(0, 1, 1, True, payloads))) == 20 + 12 + 18 + 12 + 6


def _compressed_bytes(fp16):
    cfg = DGCConfig(density=0.001, fp16_values=fp16, warmup_steps_per_stage=1)
    comp = DGCCompressor(MNIST_SHAPES, cfg, 8, 3)
    sizes = [len(encode_bucket(comp.compress(grads_for(MNIST_SHAPES, s), s))) for s in range(8)]
    return sizes


def test_compression_ratio_after_warmup():
    fp32, fp16 = _compressed_bytes(False), _compressed_bytes(True)
    # Warm-up stages send more; from step 4 on the final density.
    assert fp32[0] > fp32[1] > fp32[2] > fp32[3] > fp32[4]
    assert min(DENSE_BYTES / n for n in fp32[4:]) >= 280
    assert min(DENSE_BYTES / n for n in fp16[4:]) >= 500


def _sample_bucket_bytes(seed=0):
    comp = DGCCompressor(SMALL_SHAPES, DGCConfig(density=0.1, dense_below=10), 2, 1)
    return encode_bucket(comp.compress(grads_for(SMALL_SHAPES, seed), 7))


def _entry_offset(data, i):
    """Byte offset of tensor i's entry header."""
    off = HEADER_SIZE
    vb = 2 if data[5] == 1 else 4
    for _ in range(i):
        _, kind, _, numel, k = ENTRY.unpack_from(data, off)
        off += ENTRY_SIZE + (numel * vb if kind == 0 else k * (4 + vb))
    return off


def _patch(data, offset, fmt, value):
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_malformed_buckets_raise_frame_error():
    good = _sample_bucket_bytes()
    decode_bucket(good, SMALL_SHAPES)
    e0, e1, e2 = (_entry_offset(good, i) for i in range(3))
    assert ENTRY.unpack_from(good, e0)[1] == 1 and ENTRY.unpack_from(good, e2)[4] == 4  # sparse, k = 4
    bad = {
        "empty": b"",
        "short header": good[:19],
        "wrong magic": b"DGX\x00" + good[4:],
        "version": _patch(good, 4, "<B", 2),
        "value dtype": _patch(good, 5, "<B", 7),
        "tensor count": _patch(good, 6, "<H", 4),
        "rank >= world": _patch(good, 8, "<I", 2),
        "zero world": _patch(good, 16, "<I", 0),
        "entry index": _patch(good, e1, "<H", 2),
        "kind": _patch(good, e1 + 2, "<B", 9),
        "reserved": _patch(good, e1 + 3, "<B", 1),
        "numel mismatch": _patch(good, e0 + 4, "<I", 31),
        "dense k": _patch(good, e1 + 8, "<I", 2),
        "huge k": _patch(good, e2 + 8, "<I", 2**32 - 1),
        "k > numel": _patch(good, e2 + 8, "<I", 41),
        "k one more": _patch(good, e2 + 8, "<I", 5),
        "index out of range": _patch(good, e2 + ENTRY_SIZE + 12, "<i", 40),
        "negative index": _patch(good, e2 + ENTRY_SIZE, "<i", -1),
        "unsorted": _patch(good, e2 + ENTRY_SIZE + 4, "<i", 0),
        "trailing": good + b"\x00",
    }
    for cut in range(len(good)):
        bad[f"truncated at {cut}"] = good[:cut]
    assert issubclass(FrameError, DecodeError)
    for name, data in bad.items():
        with pytest.raises(FrameError):
            decode_bucket(data, SMALL_SHAPES)
    with pytest.raises(FrameError):
        decode_bucket(good, SMALL_SHAPES, world_size=3)
    with pytest.raises(FrameError):
        decode_bucket(good, SMALL_SHAPES[:2])
    with pytest.raises(FrameError):
        decode_bucket(good, [("w", (5, 5))] + SMALL_SHAPES[1:])
    with pytest.raises(FrameError):
        decode_bucket(object(), SMALL_SHAPES)


def _check_decoded(bucket):
    assert len(bucket.payloads) == len(SMALL_SHAPES)
    for p, (_, shape) in zip(bucket.payloads, SMALL_SHAPES):
        assert p.numel == math.prod(shape) and p.values.dtype == torch.float32
        if p.indices is None:
            assert p.values.shape == (p.numel,)
        else:
            assert p.indices.shape == p.values.shape and p.k <= p.numel
            if p.k:
                assert p.indices[0] >= 0 and p.indices[-1] < p.numel
                assert (p.indices.diff() > 0).all()


def _decode_or_frame_error(data):
    try:
        bucket = decode_bucket(data, SMALL_SHAPES)
    except FrameError:
        return
    _check_decoded(bucket)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes(data):
    _decode_or_frame_error(data)


@st.composite
def mutated_buckets(draw):
    data = bytearray(_sample_bucket_bytes(draw(st.integers(0, 2**16))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "extend", "splice"]))
        if op in ("flip", "set") and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = data[i] ^ (1 << draw(st.integers(0, 7))) if op == "flip" else draw(st.integers(0, 255))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif op == "extend":
            data += draw(st.binary(min_size=1, max_size=8))
        elif op == "splice" and len(data) >= 4:
            # A whole u32 window: hits numel / k / rank / step / indices at once.
            i = draw(st.integers(0, len(data) - 4))
            data[i:i + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 2, 4, 30, 2**31 - 1, 2**31, 2**32 - 1])))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_buckets())
def test_mutated_buckets(data):
    _decode_or_frame_error(data)


def test_encode_refuses_what_the_header_cannot_hold():
    p = [TensorPayload(3, torch.ones(3))]
    for bucket in (Bucket(2, 0, 2, False, p), Bucket(0, -1, 1, False, p), Bucket(0, 2**32, 1, False, p),
                   Bucket(0, 0, 1, False, [TensorPayload(4, torch.ones(3))]),
                   Bucket(0, 0, 1, False, [TensorPayload(4, torch.ones(2), torch.tensor([1]))])):
        with pytest.raises(ValueError):
            encode_bucket(bucket)


# ------------------------------------------------------------------ averaging


def _rank_buckets(world_size, step=0, fp16=False):
    buckets = []
    for rank in range(world_size):
        comp = DGCCompressor(MNIST_SHAPES, DGCConfig(density=0.01, fp16_values=fp16), world_size, rank)
        buckets.append(comp.compress(grads_for(MNIST_SHAPES, 50 + rank), step))
    return buckets


@pytest.mark.parametrize("fp16", [False, True])
def test_average_is_the_dense_mean_of_what_was_sent(fp16):
    world_size = 4
    buckets = [decode_bucket(encode_bucket(b), MNIST_SHAPES) for b in _rank_buckets(world_size, fp16=fp16)]
    avg = average_buckets(buckets, MNIST_SHAPES, world_size)
    for i, (_, shape) in enumerate(MNIST_SHAPES):
        assert avg[i].shape == shape and avg[i].dtype == torch.float32
        want = sum(flat_sent(b.payloads[i]) for b in buckets) / world_size
        torch.testing.assert_close(avg[i].reshape(-1).double(), want, rtol=1e-6, atol=1e-7)
    # Sparse supports of different ranks differ, so some entries are from one rank only.
    supports = [set(b.payloads[4].indices.tolist()) for b in buckets]
    assert len(set.union(*supports)) > len(supports[0])


def test_average_does_not_depend_on_arrival_order():
    buckets = _rank_buckets(4)
    want = average_buckets(buckets, MNIST_SHAPES, 4)
    for order in itertools.permutations(buckets):
        got = average_buckets(list(order), MNIST_SHAPES, 4)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    # A missing rank counts as zeros; the divisor stays the world size.
    nothing = [TensorPayload(p.numel, torch.zeros(0), torch.zeros(0, dtype=torch.int64))
               for p in buckets[3].payloads]
    three = average_buckets(buckets[:3], MNIST_SHAPES, 4)
    with_empty = average_buckets(buckets[:3] + [Bucket(3, 0, 4, False, nothing)], MNIST_SHAPES, 4)
    assert all(torch.equal(a, b) for a, b in zip(three, with_empty))


def test_average_rejects_what_must_not_be_summed():
    buckets = _rank_buckets(2)
    with pytest.raises(RejectedUpdate):
        average_buckets([buckets[0], buckets[0]], MNIST_SHAPES, 2)
    with pytest.raises(RejectedUpdate):
        average_buckets(buckets, MNIST_SHAPES, 3)
    with pytest.raises(RejectedUpdate):
        average_buckets([buckets[0], _rank_buckets(2, step=1)[1]], MNIST_SHAPES, 2)
    with pytest.raises(RejectedUpdate):
        average_buckets(buckets, MNIST_SHAPES[:-1], 2)
    nan = _rank_buckets(2)[1]
    nan.payloads[4].values[0] = float("inf")
    with pytest.raises(RejectedUpdate):
        check_bucket(nan, MNIST_SHAPES, 2)
    with pytest.raises(RejectedUpdate):
        average_buckets([buckets[0], nan], MNIST_SHAPES, 2)


# ------------------------------------------------------------------ DGCSGD


def _tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.ReLU(), torch.nn.Linear(30, 10))


@pytest.mark.parametrize("nesterov,wd,clip", [(False, 0.0, None), (True, 5e-4, None), (False, 1e-3, 1e9)])
def test_dense_baseline_is_momentum_sgd(nesterov, wd, clip):
    """density 1: every tensor dense, DGCSGD = torch.optim.SGD on the averaged gradient."""
    ref, net = _tiny_model(), _tiny_model()
    shapes = param_shapes(net)
    cfg = DGCConfig(density=1.0, momentum=0.9, nesterov=nesterov, weight_decay=wd, clip_norm=clip)
    comp, opt = DGCCompressor(shapes, cfg, 1, 0), DGCSGD(shapes, cfg)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=wd)
    x, y = torch.randn(64, 40), torch.randint(0, 10, (64,))
    for step in range(6):
        for model in (ref, net):
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
        ref_opt.step()
        params = list(net.parameters())
        avg = average_buckets([comp.compress([p.grad for p in params], step)], shapes, 1)
        opt.step(params, avg, lr=0.05)
    for a, b in zip(ref.parameters(), net.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_compressed_tensors_get_no_second_momentum():
    shapes = [("w", (40, 30)), ("b", (30,))]
    cfg = DGCConfig(momentum=0.9)
    opt = DGCSGD(shapes, cfg)
    w, b = torch.zeros(40, 30), torch.zeros(30)
    update = [torch.ones(40, 30), torch.ones(30)]
    moves = []
    for _ in range(3):
        before = (w.clone(), b.clone())
        opt.step([w, b], update, lr=0.1)
        moves.append((float((before[0] - w).mean()), float((before[1] - b).mean())))
    assert [mw for mw, _ in moves] == pytest.approx([0.1, 0.1, 0.1])  # sparse: as given
    assert [mb for _, mb in moves] == pytest.approx([0.1, 0.19, 0.271])  # dense: momentum here


def test_weight_decay_has_its_own_momentum_and_is_not_sent():
    shapes = [("w", (40, 30))]
    cfg = DGCConfig(momentum=0.9, weight_decay=0.01)
    comp, opt = DGCCompressor(shapes, cfg, 1, 0), DGCSGD(shapes, cfg)
    w = torch.full((40, 30), 2.0)
    ref = w.clone().requires_grad_()
    ref_opt = torch.optim.SGD([ref], lr=0.5, momentum=0.9, weight_decay=0.01)
    for step in range(4):
        bucket = comp.compress([torch.zeros(40, 30)], step)
        assert not bucket.payloads[0].values.any()  # zero gradient: nothing but zeros sent
        opt.step([w], average_buckets([bucket], shapes, 1), lr=0.5)
        ref.grad = torch.zeros(40, 30)
        ref_opt.step()
    torch.testing.assert_close(w, ref.detach())


def test_sgd_rejects_mismatched_lists():
    opt = DGCSGD(SMALL_SHAPES, DGCConfig())
    with pytest.raises(ValueError):
        opt.step([torch.zeros(6, 5)], [torch.zeros(30)], lr=0.1)


def test_ranks_train_together_and_stay_identical():
    """Two ranks, each its own model copy and data shard: the averaged DGC
    step keeps their weights bit-identical and the loss goes down."""
    world_size = 2
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(256, 40, generator=gen)
    y = (x[:, :10].argmax(dim=1))  # a learnable labelling
    cfg = DGCConfig(density=0.02, momentum=0.9, clip_norm=5.0, weight_decay=1e-4,
                    warmup_steps_per_stage=3, dense_below=100)
    models = [_tiny_model() for _ in range(world_size)]
    shapes = param_shapes(models[0])
    comps = [DGCCompressor(shapes, cfg, world_size, r) for r in range(world_size)]
    opts = [DGCSGD(shapes, cfg) for _ in range(world_size)]
    loss = lambda m: float(torch.nn.functional.cross_entropy(m(x), y).detach())
    first = loss(models[0])
    for step in range(60):
        wire = []
        for r, model in enumerate(models):
            model.zero_grad()
            shard = slice(r * 128, (r + 1) * 128)
            torch.nn.functional.cross_entropy(model(x[shard]), y[shard]).backward()
            bucket = comps[r].compress([p.grad for p in model.parameters()], step)
            wire.append(encode_bucket(bucket))
        received = [decode_bucket(b, shapes, world_size=world_size) for b in wire]
        for r, model in enumerate(models):
            avg = average_buckets(received[::-1] if r else received, shapes, world_size)
            opts[r].step(list(model.parameters()), avg, lr=0.1)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)
    assert loss(models[0]) < 0.6 * first


# ------------------------------------------------------------------ cost (measured, not asserted)


def test_compress_cost_on_the_mnist_model(capsys):
    comp = DGCCompressor(MNIST_SHAPES, DGCConfig(density=0.001, clip_norm=5.0), 8, 0)
    grads = grads_for(MNIST_SHAPES, 1)
    times = []
    for step in range(25):
        t0 = time.perf_counter()
        comp.compress(grads, step)
        times.append(time.perf_counter() - t0)
    times.sort()
    with capsys.disabled():
        print(f"\n[dgc] compress() of 1,199,882 params at density 0.001: "
              f"median {times[len(times) // 2] * 1e3:.2f} ms, best {times[0] * 1e3:.2f} ms; "
              f"bucket fp32 {_compressed_bytes(False)[-1]} B, fp16 {_compressed_bytes(True)[-1]} B "
              f"of {DENSE_BYTES} B dense")
