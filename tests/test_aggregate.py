"""FedAvg: weighted mean, sparse merge, mixed kinds, order independence, checks."""

import random

import numpy as np
import pytest

from dtemu.core.fl.aggregate import FedAvg, Update, check_update
from dtemu.core.compression.codecs import CodecParams, Dense, Sparse, decode, encode
from dtemu.core.errors import RejectedUpdate

DIM = 1000


def rvec(seed, dim=DIM, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(dim) * scale).astype(np.float32)


def dense(client, n, values, kind="delta"):
    return Update(client, n, kind, Dense(np.asarray(values, dtype=np.float32)))


def sparse(client, n, dim, indices, values):
    return Update(
        client, n, "delta", Sparse(dim, np.asarray(indices, np.int64), np.asarray(values, np.float32))
    )


def test_weighted_mean_of_weights():
    g = rvec(0)
    ws = [rvec(i) for i in (1, 2, 3)]
    ns = [10, 30, 60]
    out = FedAvg().aggregate(g, [dense(f"c{i}", n, w, "weights") for i, (n, w) in enumerate(zip(ns, ws))])
    want = sum(n * w.astype(np.float64) for n, w in zip(ns, ws)) / sum(ns)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_weighted_mean_of_deltas_small_exact():
    g = np.array([1.0, 2.0], dtype=np.float32)
    out = FedAvg().aggregate(g, [dense("a", 1, [3, 0]), dense("b", 3, [-1, 4])])
    np.testing.assert_array_equal(out, [1 + (3 - 3) / 4, 2 + 12 / 4])


def test_identical_updates_give_that_update_exactly():
    g = rvec(0)
    d = rvec(1)
    out = FedAvg().aggregate(g, [dense(c, n, d) for c, n in (("a", 7), ("b", 13), ("c", 1))])
    np.testing.assert_array_equal(out, (g.astype(np.float64) + d).astype(np.float32))


def test_sparse_merge_equals_dense_equivalent():
    g = rvec(0)
    rng = np.random.default_rng(5)
    sparse_updates, dense_updates = [], []
    for i, n in enumerate([5, 9, 2, 40]):
        idx = np.sort(rng.choice(DIM, size=100, replace=False))  # overlapping index sets
        vals = rvec(10 + i, dim=100)
        sparse_updates.append(sparse(f"c{i}", n, DIM, idx, vals))
        dense_updates.append(dense(f"c{i}", n, sparse_updates[-1].payload.to_dense()))
    a = FedAvg().aggregate(g, sparse_updates)
    b = FedAvg().aggregate(g, dense_updates)
    np.testing.assert_array_equal(a, b)


def test_sparse_repeated_indices_accumulate():
    g = np.zeros(4, dtype=np.float32)
    out = FedAvg().aggregate(g, [sparse("a", 1, 4, [2, 2, 0], [1.0, 2.0, 5.0])])
    np.testing.assert_array_equal(out, [5, 0, 3, 0])


def test_decoded_sparse_packets_aggregate():
    g = rvec(0)
    updates = []
    for i, name in enumerate(["s4", "sq8", "q8", "fp32"]):
        payload = decode(encode(rvec(20 + i), CodecParams(name, chunk=64)), expected_dim=DIM)
        updates.append(Update(f"c{i}", 10 + i, "delta", payload))
    out = FedAvg().aggregate(g, updates)
    n = sum(u.num_samples for u in updates)
    want = g.astype(np.float64) + sum(u.num_samples * u.payload.to_dense().astype(np.float64) for u in updates) / n
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)


def test_mixed_kinds():
    g = rvec(0)
    w = rvec(1)
    d = rvec(2)
    idx = np.arange(0, DIM, 7)
    s = rvec(3, dim=idx.size)
    updates = [
        dense("w", 2, w, "weights"),
        dense("d", 3, d),
        sparse("s", 5, DIM, idx, s),
    ]
    out = FedAvg().aggregate(g, updates)
    g64 = g.astype(np.float64)
    sd = np.zeros(DIM)
    sd[idx] = s
    want = g64 + (2 * (w - g64) + 3 * d.astype(np.float64) + 5 * sd) / 10
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_order_independence_is_bitwise():
    g = rvec(0, scale=3.0)
    rng = np.random.default_rng(9)
    updates = []
    for i in range(12):
        kind = ("weights", "delta", "sparse")[i % 3]
        n = int(rng.integers(1, 1000))
        if kind == "sparse":
            idx = np.sort(rng.choice(DIM, size=150, replace=False))
            updates.append(sparse(f"client-{i:02d}", n, DIM, idx, rvec(100 + i, 150, scale=1e3)))
        else:
            updates.append(dense(f"client-{i:02d}", n, rvec(100 + i, scale=10.0 ** (i % 5 - 2)), kind))
    ref = FedAvg(server_lr=0.7).aggregate(g, updates)
    shuffler = random.Random(1)
    for _ in range(10):
        shuffled = updates[:]
        shuffler.shuffle(shuffled)
        out = FedAvg(server_lr=0.7).aggregate(g, shuffled)
        assert out.tobytes() == ref.tobytes()


def test_server_lr_scales_the_step():
    g = rvec(0)
    updates = [dense("a", 1, rvec(1)), dense("b", 2, rvec(2))]
    step1 = FedAvg(1.0).aggregate(g, updates).astype(np.float64) - g
    step_half = FedAvg(0.5).aggregate(g, updates).astype(np.float64) - g
    np.testing.assert_allclose(step_half, 0.5 * step1, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        FedAvg(0.0)


def test_input_is_not_modified():
    g = rvec(0)
    g_before = g.copy()
    u = dense("a", 1, rvec(1), "weights")
    v_before = u.payload.values.copy()
    FedAvg().aggregate(g, [u])
    np.testing.assert_array_equal(g, g_before)
    np.testing.assert_array_equal(u.payload.values, v_before)


def test_empty_and_duplicate_clients():
    with pytest.raises(ValueError):
        FedAvg().aggregate(rvec(0), [])
    with pytest.raises(ValueError, match="two updates"):
        FedAvg().aggregate(rvec(0), [dense("a", 1, rvec(1)), dense("a", 2, rvec(2))])


# ------------------------------------------------------------------ check_update


def test_check_update_accepts_good_updates():
    check_update(dense("a", 1, rvec(1)), DIM)
    check_update(sparse("a", 1, DIM, [0, 5], [1, 2]), DIM, max_norm=3.0)
    check_update(dense("a", 1, np.full(DIM, 0.01), "weights"), DIM, max_norm=1.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_check_update_rejects_non_finite(bad):
    v = rvec(1)
    v[17] = bad
    with pytest.raises(RejectedUpdate):
        check_update(dense("a", 1, v), DIM)
    with pytest.raises(RejectedUpdate):
        check_update(sparse("a", 1, DIM, [3, 17], [1.0, bad]), DIM)
    with pytest.raises(RejectedUpdate):
        FedAvg().aggregate(rvec(0), [dense("a", 1, v)])


def test_check_update_rejects_wrong_dim():
    with pytest.raises(RejectedUpdate):
        check_update(dense("a", 1, rvec(1, dim=DIM - 1)), DIM)
    with pytest.raises(RejectedUpdate):
        check_update(sparse("a", 1, DIM + 1, [0], [1.0]), DIM)
    with pytest.raises(RejectedUpdate):
        check_update(sparse("a", 1, DIM, [DIM], [1.0]), DIM)
    with pytest.raises(RejectedUpdate):
        check_update(sparse("a", 1, DIM, [0, 1], [1.0]), DIM)


def test_check_update_rejects_bad_counts_and_kinds():
    for n in (0, -3):
        with pytest.raises(RejectedUpdate):
            check_update(dense("a", n, rvec(1)), DIM)
    with pytest.raises(RejectedUpdate):
        check_update(dense("a", 1, rvec(1), "gradient"), DIM)
    with pytest.raises(RejectedUpdate):
        check_update(Update("a", 1, "weights", Sparse(DIM, np.array([0]), np.array([1.0], np.float32))), DIM)


def test_check_update_norm_bound():
    v = np.zeros(DIM, dtype=np.float32)
    v[:2] = [3.0, 4.0]  # norm 5
    check_update(dense("a", 1, v), DIM, max_norm=5.0)
    with pytest.raises(RejectedUpdate, match="norm"):
        check_update(dense("a", 1, v), DIM, max_norm=4.99)
    with pytest.raises(RejectedUpdate):
        check_update(sparse("a", 1, DIM, [0, 1], [3.0, 4.0]), DIM, max_norm=4.99)
    # For full weights the bound is on w - base when base is given.
    base = np.ones(DIM, dtype=np.float32)
    w = base + v
    check_update(dense("a", 1, w, "weights"), DIM, max_norm=5.0, base=base)
    with pytest.raises(RejectedUpdate):
        check_update(dense("a", 1, w, "weights"), DIM, max_norm=4.99, base=base)
    # Large float32 entries: the norm must not overflow to a spurious inf.
    big = np.full(DIM, 1e30, dtype=np.float32)
    check_update(dense("a", 1, big), DIM, max_norm=1e32)
