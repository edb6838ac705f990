"""Update codecs: round trips, exact sizes, malformed packets, error feedback."""

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtemu.core.compression.codecs import (
    CODECS,
    HEADER,
    HEADER_SIZE,
    CodecParams,
    Dense,
    ErrorFeedback,
    Sparse,
    decode,
    encode,
    packet_size,
    peek_codec,
    topk_count,
)
from dtemu.core.errors import CodecError

MODEL_DIM = 1_199_882  # the real model's parameter count
MAGIC = {"fp32": b"FP32", "q8": b"Q8\x00\x00", "s4": b"S4\x00\x00", "sq8": b"SQ8\x00"}
CODEC_ID = {"fp32": 0, "q8": 1, "s4": 2, "sq8": 3}


def vec(dim, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(dim) * scale).astype(np.float32)


@pytest.fixture(scope="module")
def big():
    return vec(MODEL_DIM, seed=42)


def expected_size(name, dim, chunk=8192, density=0.1):
    k = 0 if dim == 0 else min(dim, max(1, math.ceil(round(density * dim, 9))))
    if name == "fp32":
        return 20 + 4 * dim
    if name == "q8":
        return 20 + 4 * math.ceil(dim / chunk) + dim
    if name == "s4":
        return 20 + 8 * k
    return 20 + 4 * k + 4 * math.ceil(k / chunk) + k


def q8_bound(w, chunk):
    """Per-element error bound: chunk max / 254, plus float32 rounding slack."""
    n = w.shape[0]
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, chunk):
        m = float(np.abs(w[start : start + chunk]).max())
        out[start : start + chunk] = m / 254 * (1 + 1e-5)
    return out


def topk_reference(w, k):
    """Slow, obviously right: stable sort by descending magnitude, lowest index wins ties."""
    order = sorted(range(len(w)), key=lambda i: (-abs(float(w[i])), i))
    return np.array(sorted(order[:k]), dtype=np.int64)


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("dim", [0, 1, 7, 100])
def test_fp32_round_trip_is_exact(dim):
    w = vec(dim)
    d = decode(encode(w, CodecParams("fp32")), expected_dim=dim)
    assert isinstance(d, Dense) and d.dim == dim
    assert d.values.dtype == np.float32 and d.values.flags.writeable
    np.testing.assert_array_equal(d.values, w)


def test_fp32_big_round_trip_is_exact(big):
    d = decode(encode(big, CodecParams("fp32")))
    np.testing.assert_array_equal(d.values, big)


@pytest.mark.parametrize("dim,chunk", [(1, 8192), (7, 8192), (7, 3), (24, 8), (25, 8), (1000, 64)])
def test_q8_error_bound(dim, chunk):
    # Chunks of very different magnitude, so a wrong scale would show.
    w = vec(dim, seed=dim) * np.float32(10.0) ** np.linspace(-3, 3, dim).astype(np.float32)
    d = decode(encode(w, CodecParams("q8", chunk=chunk)), expected_dim=dim)
    assert isinstance(d, Dense) and d.values.dtype == np.float32
    err = np.abs(d.values.astype(np.float64) - w)
    assert (err <= q8_bound(w, chunk)).all()


def test_q8_zero_chunks_and_boundaries():
    chunk = 4
    w = np.array([0, 0, 0, 0, 1, -2, 3, -4, 0, 0, 0, 0, 5, 0.5], dtype=np.float32)
    packet = encode(w, CodecParams("q8", chunk=chunk))
    scales = np.frombuffer(packet, "<f4", count=4, offset=HEADER_SIZE)
    np.testing.assert_array_equal(scales[[0, 2]], [0, 0])  # all-zero chunks: scale 0
    assert scales[1] == np.float32(4 / 127) and scales[3] == np.float32(5 / 127)
    d = decode(packet).values
    np.testing.assert_array_equal(d[:4], 0)
    np.testing.assert_array_equal(d[8:12], 0)
    # Each chunk's largest magnitude maps to ±127 and comes back within rounding.
    np.testing.assert_allclose(d[[7, 12]], [-4, 5], rtol=1e-6)
    assert (np.abs(d - w) <= q8_bound(w, chunk)).all()


def test_q8_big(big):
    d = decode(encode(big, CodecParams("q8")), expected_dim=MODEL_DIM)
    assert MODEL_DIM % 8192 != 0  # the last chunk is partial
    assert (np.abs(d.values.astype(np.float64) - big) <= q8_bound(big, 8192)).all()


@pytest.mark.parametrize("dim,density", [(1, 0.1), (7, 0.1), (7, 0.5), (50, 0.1), (30, 1.0)])
def test_s4_keeps_exactly_the_topk(dim, density):
    w = vec(dim, seed=dim)
    d = decode(encode(w, CodecParams("s4", density=density)), expected_dim=dim)
    k = topk_count(dim, density)
    assert isinstance(d, Sparse) and d.dim == dim and len(d.indices) == k
    assert d.indices.dtype == np.int64 and d.values.dtype == np.float32
    np.testing.assert_array_equal(d.indices, topk_reference(w, k))
    np.testing.assert_array_equal(d.values, w[d.indices])
    dense = d.to_dense()
    np.testing.assert_array_equal(dense[d.indices], w[d.indices])
    assert np.count_nonzero(np.delete(dense, d.indices)) == 0


def test_topk_ties_go_to_the_lowest_index():
    w = np.array([1, -3, 3, 2, -3, 3, 0], dtype=np.float32)
    d = decode(encode(w, CodecParams("s4", density=0.3)))  # k = ceil(2.1) = 3
    np.testing.assert_array_equal(d.indices, [1, 2, 4])
    w = np.ones(10, dtype=np.float32)
    d = decode(encode(w, CodecParams("s4", density=0.3)))
    np.testing.assert_array_equal(d.indices, [0, 1, 2])


def test_topk_count_uses_the_decimal_density():
    assert topk_count(30, 0.1) == 3  # 0.1 * 30 == 3.0000000000000004 in binary
    assert topk_count(MODEL_DIM, 0.1) == 119_989
    assert topk_count(1, 0.1) == 1 and topk_count(0, 0.1) == 0


def test_encode_is_deterministic(big):
    for name in CODECS:
        p = CodecParams(name)
        assert encode(big, p) == encode(big.copy(), p)


def test_s4_big_is_topk(big):
    d = decode(encode(big, CodecParams("s4")))
    k = topk_count(MODEL_DIM, 0.1)
    assert len(d.indices) == k
    np.testing.assert_array_equal(d.values, big[d.indices])
    kept = np.abs(big[d.indices]).min()
    rest = np.abs(np.delete(big, d.indices)).max()
    assert kept >= rest


@pytest.mark.parametrize("dim,chunk", [(1, 8192), (7, 8192), (7, 2), (200, 8)])
def test_sq8_topk_with_int8_error(dim, chunk):
    w = vec(dim, seed=dim + 1)
    d = decode(encode(w, CodecParams("sq8", chunk=chunk, density=0.5)), expected_dim=dim)
    k = topk_count(dim, 0.5)
    assert isinstance(d, Sparse) and len(d.indices) == k
    np.testing.assert_array_equal(d.indices, topk_reference(w, k))
    exact = w[d.indices]
    assert (np.abs(d.values.astype(np.float64) - exact) <= q8_bound(exact, chunk)).all()


def test_sq8_big(big):
    d = decode(encode(big, CodecParams("sq8")))
    s4 = decode(encode(big, CodecParams("s4")))
    np.testing.assert_array_equal(d.indices, s4.indices)
    assert (np.abs(d.values.astype(np.float64) - s4.values) <= q8_bound(s4.values, 8192)).all()


def test_decode_accepts_memoryview_and_bytearray():
    w = vec(33)
    packet = encode(w, CodecParams("q8", chunk=8))
    a = decode(packet).values
    np.testing.assert_array_equal(decode(memoryview(packet)).values, a)
    np.testing.assert_array_equal(decode(bytearray(packet)).values, a)
    # A packet inside a larger receive buffer.
    buf = memoryview(b"xx" + packet + b"yy")
    np.testing.assert_array_equal(decode(buf[2:-2]).values, a)


def test_decoded_arrays_are_owned():
    packet = bytearray(encode(vec(10), CodecParams("fp32")))
    d = decode(packet)
    before = d.values.copy()
    packet[HEADER_SIZE:] = bytes(len(packet) - HEADER_SIZE)
    np.testing.assert_array_equal(d.values, before)
    d.values[0] = 1.0  # writable


def test_lossy_codecs_refuse_non_finite_input():
    w = vec(10)
    w[3] = np.nan
    for name in ("q8", "s4", "sq8"):
        with pytest.raises(ValueError):
            encode(w, CodecParams(name))
    # fp32 carries it, so the server can reject the update for what it is.
    assert not decode(encode(w, CodecParams("fp32"))).is_finite()


def test_params_are_validated():
    for bad in [dict(name="zip"), dict(chunk=0), dict(density=0.0), dict(density=1.5)]:
        with pytest.raises(ValueError):
            CodecParams(**bad)


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dim", [0, 1, 7, 8191, 8192, 8193, 30, 1000])
def test_packet_size_is_exact(name, dim):
    p = CodecParams(name)
    assert len(encode(vec(dim), p)) == packet_size(dim, p) == expected_size(name, dim)


@pytest.mark.parametrize("name,chunk,density", [("q8", 5, 0.1), ("sq8", 3, 0.25), ("s4", 8192, 0.33)])
def test_packet_size_with_params(name, chunk, density):
    p = CodecParams(name, chunk=chunk, density=density)
    for dim in (1, 9, 64, 101):
        assert len(encode(vec(dim), p)) == packet_size(dim, p) == expected_size(name, dim, chunk, density)


def test_big_sizes_and_ratios(big):
    sizes = {}
    for name in CODECS:
        p = CodecParams(name)
        sizes[name] = len(encode(big, p))
        assert sizes[name] == packet_size(MODEL_DIM, p) == expected_size(name, MODEL_DIM)
    fp32 = sizes["fp32"]
    assert sizes["q8"] / fp32 <= 0.251
    assert sizes["s4"] / fp32 <= 0.201
    assert sizes["sq8"] / fp32 <= 0.126


def test_peek_codec():
    for name in CODECS:
        assert peek_codec(encode(vec(3), CodecParams(name))) == name
    for bad in [b"", b"FP3", b"XXXX" + bytes(16)]:
        with pytest.raises(CodecError):
            peek_codec(bad)


# ------------------------------------------------------------------ malformed packets


def header(name="fp32", version=1, codec_id=None, reserved=0, dim=4, k=None, chunk=None, magic=None):
    return HEADER.pack(
        MAGIC[name] if magic is None else magic,
        version,
        CODEC_ID[name] if codec_id is None else codec_id,
        reserved,
        dim,
        dim if k is None else k,
        (8192 if name in ("q8", "sq8") else 0) if chunk is None else chunk,
    )


def s4_packet(indices, values, dim):
    return header("s4", dim=dim, k=len(indices)) + struct.pack(
        f"<{len(indices)}i{len(values)}f", *indices, *values
    )


def sq8_packet(indices, scales, codes, dim, chunk=8192):
    k = len(indices)
    return header("sq8", dim=dim, k=k, chunk=chunk) + struct.pack(
        f"<{k}i{len(scales)}f{len(codes)}b", *indices, *scales, *codes
    )


def q8_packet(scales, codes, chunk=8192):
    return header("q8", dim=len(codes), chunk=chunk) + struct.pack(
        f"<{len(scales)}f{len(codes)}b", *scales, *codes
    )


def test_well_formed_handmade_packets_decode():
    # The builders below are right, so each rejection is for the one fault injected.
    assert decode(header("fp32", dim=2) + struct.pack("<2f", 1, 2)).values.tolist() == [1, 2]
    assert decode(s4_packet([1, 3], [5, 6], dim=4)).to_dense().tolist() == [0, 5, 0, 6]
    assert decode(q8_packet([1.0], [1, -2, 3])).values.tolist() == [1, -2, 3]
    assert decode(sq8_packet([0, 2], [0.5], [2, -4], dim=3)).to_dense().tolist() == [1, 0, -2]


MALFORMED = {
    "empty": b"",
    "shorter than header": encode(vec(4), CodecParams("fp32"))[:19],
    "wrong magic": header(magic=b"FP64") + bytes(16),
    "magic/codec id disagree": header("fp32", codec_id=1) + bytes(16),
    "codec id out of range": header("fp32", codec_id=9) + bytes(16),
    "unknown version": header(version=2) + bytes(16),
    "version zero": header(version=0) + bytes(16),
    "reserved nonzero": header(reserved=1) + bytes(16),
    "dense k != D": header("fp32", dim=4, k=3) + bytes(12),
    "q8 k != D": header("q8", dim=4, k=5) + bytes(8),
    "s4 k > D": header("s4", dim=2, k=3) + bytes(24),
    "sq8 k > D": header("sq8", dim=2, k=3) + bytes(12 + 4 + 3),
    "q8 chunk 0": header("q8", dim=4, chunk=0) + bytes(8),
    "sq8 chunk 0": header("sq8", dim=4, k=1, chunk=0) + bytes(4 + 4 + 1),
    "fp32 chunk nonzero": header("fp32", chunk=8) + bytes(16),
    "s4 chunk nonzero": header("s4", dim=4, k=1, chunk=8) + bytes(8),
    "fp32 body short": header("fp32", dim=4) + bytes(15),
    "fp32 body long": header("fp32", dim=4) + bytes(17),
    "q8 body short": header("q8", dim=4) + bytes(7),
    "s4 body long": header("s4", dim=4, k=1) + bytes(9),
    "sq8 body short": header("sq8", dim=4, k=2) + bytes(8 + 4 + 1),
    "huge D": header("fp32", dim=(1 << 31)),
    "max u32 D": header("q8", dim=(1 << 32) - 1),
    "huge k": header("s4", dim=1 << 28, k=1 << 28),
    "index out of range": s4_packet([1, 4], [1, 2], dim=4),
    "negative index": s4_packet([-1, 2], [1, 2], dim=4),
    "indices not increasing": s4_packet([2, 1], [1, 2], dim=4),
    "duplicate indices": s4_packet([1, 1], [1, 2], dim=4),
    "int32 wrap looks increasing": s4_packet([2**31 - 1, -(2**31)], [1, 2], dim=4),
    "sq8 index out of range": sq8_packet([0, 9], [1.0], [1, 1], dim=4),
    "q8 NaN scale": q8_packet([float("nan")], [1, 2]),
    "q8 Inf scale": q8_packet([float("inf")], [1, 2]),
    "q8 negative scale": q8_packet([-1.0], [1, 2]),
    "sq8 NaN scale": sq8_packet([0, 1], [float("nan")], [1, 1], dim=4),
    "q8 code -128": q8_packet([1.0], [1, -128]),
}


@pytest.mark.parametrize("what", list(MALFORMED))
def test_malformed_packets_raise_codec_error(what):
    with pytest.raises(CodecError):
        decode(MALFORMED[what])


def test_huge_scale_decodes_to_a_non_finite_update():
    # Not malformed: the values overflow, and the aggregator's check rejects them.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = decode(q8_packet([3e38], [127, 1]))
    assert not d.is_finite()


def test_expected_and_max_dim():
    packet = encode(vec(10), CodecParams("q8"))
    assert decode(packet, expected_dim=10).dim == 10
    with pytest.raises(CodecError, match="expected 11"):
        decode(packet, expected_dim=11)
    with pytest.raises(CodecError, match="max_dim"):
        decode(packet, max_dim=9)


def test_codec_error_is_the_only_error():
    # CodecError is also a ValueError (via DecodeError), but never a bare one.
    with pytest.raises(CodecError) as e:
        decode(b"\x00" * 3)
    assert type(e.value) is CodecError


def check_valid(obj):
    """What any successful decode must hand back."""
    assert isinstance(obj, (Dense, Sparse))
    dense = obj.to_dense()
    assert dense.dtype == np.float32 and dense.shape == (obj.dim,)
    if isinstance(obj, Sparse):
        assert obj.indices.dtype == np.int64 and obj.values.dtype == np.float32
        assert obj.indices.shape == obj.values.shape
        if obj.indices.size:
            assert obj.indices[0] >= 0 and obj.indices[-1] < obj.dim
            assert (np.diff(obj.indices) > 0).all()


def decode_or_codec_error(data):
    try:
        obj = decode(data, max_dim=1 << 20)
    except CodecError:
        return
    check_valid(obj)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes(data):
    decode_or_codec_error(data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CODECS), st.binary(min_size=16, max_size=16), st.binary(max_size=120))
def test_arbitrary_body_after_a_real_magic(name, rest_of_header, body):
    decode_or_codec_error(MAGIC[name] + rest_of_header + body)


@st.composite
def mutated_packets(draw):
    name = draw(st.sampled_from(CODECS))
    dim = draw(st.integers(0, 40))
    chunk = draw(st.integers(1, 10))
    density = draw(st.sampled_from([0.1, 0.3, 1.0]))
    seed = draw(st.integers(0, 2**16))
    packet = bytearray(encode(vec(dim, seed), CodecParams(name, chunk=chunk, density=density)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "truncate", "extend", "splice"]))
        if op in ("flip", "set") and packet:
            i = draw(st.integers(0, len(packet) - 1))
            packet[i] = packet[i] ^ (1 << draw(st.integers(0, 7))) if op == "flip" else draw(st.integers(0, 255))
        elif op == "truncate":
            del packet[draw(st.integers(0, len(packet))) :]
        elif op == "extend":
            packet += draw(st.binary(min_size=1, max_size=8))
        elif op == "splice" and len(packet) >= 4:
            # Overwrite a u32-sized window: hits D / k / chunk / indices / scales whole.
            i = draw(st.integers(0, len(packet) - 4))
            packet[i : i + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 2, 7, 2**31 - 1, 2**31, 2**32 - 1])))
    return bytes(packet)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_packets())
def test_mutated_packets(packet):
    decode_or_codec_error(packet)


# ------------------------------------------------------------------ error feedback


@pytest.mark.parametrize("name,density", [("q8", 0.1), ("s4", 0.1), ("sq8", 0.2), ("fp32", 0.1)])
def test_error_feedback_conserves_the_sum(name, density):
    dim, rounds = 500, 8
    ef = ErrorFeedback(CodecParams(name, chunk=64, density=density))
    assert ef.residual is None
    sent = np.zeros(dim, dtype=np.float64)
    meant = np.zeros(dim, dtype=np.float64)
    for r in range(rounds):
        x = vec(dim, seed=100 + r)
        meant += x
        sent += decode(ef.encode(x), expected_dim=dim).to_dense()
    np.testing.assert_allclose(sent + ef.residual, meant, atol=1e-4)
    if name == "fp32":
        assert not ef.residual.any()


def test_error_feedback_sends_what_was_dropped():
    # With s4 at one entry per round, a dropped entry is sent once it has built up.
    ef = ErrorFeedback(CodecParams("s4", density=0.5))
    x = np.array([3.0, 2.0], dtype=np.float32)
    first = decode(ef.encode(x)).to_dense()
    second = decode(ef.encode(x)).to_dense()
    np.testing.assert_array_equal(first, [3, 0])
    np.testing.assert_array_equal(second, [0, 4])  # residual 2 + new 2 beats 3
    np.testing.assert_array_equal(ef.residual, [3, 0])


def test_error_feedback_rejects_a_shape_change():
    ef = ErrorFeedback(CodecParams("q8"))
    ef.encode(vec(5))
    with pytest.raises(ValueError):
        ef.encode(vec(6))
