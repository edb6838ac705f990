"""core.wire.half: torch's float16 conversion gives the wire the bytes numpy's would."""

import numpy as np
import pytest

from dtemu.core.geo import payload
from dtemu.core.wire.half import from_half, to_half


def _edge_cases() -> np.ndarray:
    tiny = np.float32(2.0 ** -24)          # the smallest half subnormal
    vals = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e9, -1e9, np.inf, -np.inf,
            tiny, tiny / 2, tiny * 0.75, tiny * 1.5, 2.0 ** -14, 2.0 ** -15, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11,
            1e-30, -1e-30, np.finfo(np.float32).tiny, np.finfo(np.float32).max]
    return np.array(vals, dtype=np.float32)


@pytest.mark.parametrize("values", [
    _edge_cases(),
    (np.random.default_rng(0).standard_normal(100_000) * 10.0 ** np.random.default_rng(1).integers(-9, 6, 100_000)).astype(np.float32),
    np.random.default_rng(2).integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
])
def test_to_half_rounds_every_finite_value_as_numpy_does(values):
    with np.errstate(over="ignore", invalid="ignore"):
        want = values.astype("<f2")
    got = to_half(values)
    assert got.dtype == np.dtype("<f2") and got.shape == (values.size,)
    finite = ~np.isnan(values)
    assert np.array_equal(got.view(np.uint16)[finite], want.view(np.uint16)[finite])
    assert np.isnan(got[~finite]).all()


def test_from_half_is_exact_for_every_half():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view("<f2")
    got = from_half(halves.tobytes())
    want = halves.astype(np.float32)
    ok = ~np.isnan(want)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32)[ok], want.view(np.uint32)[ok])
    assert np.isnan(got[~ok]).all()
    assert from_half(b"").size == 0


def test_a_dense16_payload_round_trips_through_the_new_conversion():
    vec = np.random.default_rng(3).standard_normal(5000).astype(np.float32)
    data = payload.encode_dense(7, vec, fp16=True)
    assert data[payload.HEADER_SIZE:] == vec.astype("<f2").tobytes()
    got = payload.decode(data, vec.size)
    assert got.kind == payload.DENSE16 and np.array_equal(got.values, vec.astype(np.float16).astype(np.float32))
