"""core.models, core.params, core.train."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from dtemu.core.errors import RejectedUpdate, ScenarioError
from dtemu.core.ml.models import MODELS, build_model, model_cost
from dtemu.core.ml.params import flatten, load_flat, num_params, sha256_of
from dtemu.core.ml.evaluation import evaluate
from dtemu.core.ml.train import TrainResult, train_local
from helpers import DATA, needs_mnist


REAL_ROOT = Path(DATA)
needs_real = needs_mnist


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # On a 2-core machine shared with other work, two OpenMP threads spin at
    # barriers while another process holds a core: measured ~15x slower for
    # these small models.  Nothing tested here depends on the thread count.
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


def _tiny_linear():
    return nn.Sequential(nn.Flatten(), nn.Linear(4, 2))


def _not_a_module():
    return 42


def _random_data(n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


# --- models --------------------------------------------------------------------


def test_parameter_counts():
    assert num_params(build_model("mnist_cnn", 0)) == 1_199_882
    small = build_model("small_cnn", 0)
    assert num_params(small) == sum(p.numel() for p in small.parameters()) == 18_378


@pytest.mark.parametrize("spec", ["mnist_cnn", "small_cnn"])
def test_models_map_images_to_log_probs(spec):
    out = build_model(spec, 0)(torch.zeros(3, 1, 28, 28))
    assert out.shape == (3, 10)
    assert torch.allclose(out.exp().sum(1), torch.ones(3), atol=1e-5)


def test_build_model_deterministic_and_leaves_global_rng():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b = build_model("small_cnn", 7), build_model("small_cnn", 7)
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(flatten(a), flatten(b))
    assert not np.array_equal(flatten(a), flatten(build_model("small_cnn", 8)))
    assert a.training


def test_build_model_factory_and_errors():
    m = build_model(f"{__name__}:_tiny_linear", 0)
    assert num_params(m) == 10
    assert model_cost(f"{__name__}:_tiny_linear") is None
    with pytest.raises(ScenarioError, match="mnist_cnn.*small_cnn"):
        build_model("resnet50", 0)
    with pytest.raises(ValueError, match="known"):
        model_cost("resnet50")
    with pytest.raises(ScenarioError, match="cannot be imported"):
        build_model(f"{__name__}:nope", 0)
    with pytest.raises(ScenarioError, match="nn.Module"):
        build_model(f"{__name__}:_not_a_module", 0)


def test_model_costs_are_measured():
    for name, info in MODELS.items():
        assert model_cost(name) == info.train_s_per_sample > 0
    assert model_cost("mnist_cnn") > 5 * model_cost("small_cnn")


# --- params --------------------------------------------------------------------


def test_flatten_load_flat_round_trip():
    a, b = build_model("small_cnn", 1), build_model("small_cnn", 2)
    va = flatten(a)
    assert va.dtype == np.float32 and va.shape == (18_378,)
    load_flat(b, va)
    assert np.array_equal(flatten(b), va)
    for (ka, ta), (kb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(ta, tb)
    va[0] += 1.0  # flatten returned a copy
    assert flatten(a)[0] != va[0]
    # a read-only float64 vector still loads
    ro = np.frombuffer(flatten(a).astype(np.float64).tobytes(), dtype=np.float64)
    load_flat(b, ro)
    assert np.array_equal(flatten(b), flatten(a))


def test_flatten_includes_float_buffers_only():
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    # 6 + 2 weights/biases, 2 + 2 BN affine, 2 + 2 running stats; not num_batches_tracked
    assert num_params(m) == len(flatten(m)) == 16
    v = np.arange(16, dtype=np.float32)
    load_flat(m, v)
    assert np.array_equal(flatten(m), v)


def test_load_flat_size_mismatch():
    m = build_model("small_cnn", 0)
    with pytest.raises(RejectedUpdate):
        load_flat(m, np.zeros(18_377, dtype=np.float32))
    with pytest.raises(RejectedUpdate):
        load_flat(m, np.zeros((2, 9189), dtype=np.float32))


def test_sha256_of():
    v = np.array([1.0, -2.5], dtype=np.float32)
    want = hashlib.sha256(v.astype("<f4").tobytes()).hexdigest()
    assert sha256_of(v) == want == sha256_of(v.astype(np.float64))
    assert sha256_of(v.astype(">f4")) == want


# --- train ---------------------------------------------------------------------


def test_train_local_deterministic():
    x, y = _random_data()
    idx = np.arange(20, 280)
    kw = dict(epochs=2, batch_size=32, lr=0.02, momentum=0.9, weight_decay=1e-4, seed=5)
    torch.manual_seed(99)
    before = torch.get_rng_state()
    m1, m2 = build_model("small_cnn", 0), build_model("small_cnn", 0)
    r1 = train_local(m1, x, y, idx, **kw)
    assert torch.equal(torch.get_rng_state(), before)  # caller's RNG untouched
    r2 = train_local(m2, x, y, idx, **kw)
    assert r1 == r2
    assert sha256_of(flatten(m1)) == sha256_of(flatten(m2))
    # 260 samples, batch 32: 8 full batches + 1 partial, twice
    assert (r1.steps, r1.samples) == (18, 520)
    m3 = build_model("small_cnn", 0)
    train_local(m3, x, y, idx, **{**kw, "seed": 6})
    assert not np.array_equal(flatten(m1), flatten(m3))


def test_train_local_dropout_deterministic():
    # mnist_cnn has dropout: the seed must fix its masks too
    x, y = _random_data(64)
    m1, m2 = build_model("mnist_cnn", 0), build_model("mnist_cnn", 0)
    for m in (m1, m2):
        train_local(m, x, y, np.arange(64), epochs=1, batch_size=32, lr=0.01, seed=1)
    assert np.array_equal(flatten(m1), flatten(m2))


def test_train_local_empty():
    x, y = _random_data(10)
    m = build_model("small_cnn", 0)
    v = flatten(m)
    result = train_local(m, x, y, [], epochs=1, batch_size=8, lr=0.1, seed=0)
    assert result == TrainResult(0, 0, 0.0)
    assert np.array_equal(flatten(m), v)


def test_evaluate_restores_mode():
    x, y = _random_data(50)
    m = build_model("small_cnn", 0)
    correct, total = evaluate(m, x, y, batch_size=16)
    assert total == 50 and 0 <= correct <= 50 and m.training
    m.eval()
    evaluate(m, x, y)
    assert not m.training


@needs_real
def test_small_cnn_learns_mnist():
    from dtemu.host.datasets import load_dataset

    ds = load_dataset("mnist", REAL_ROOT)
    m = build_model("small_cnn", 0)
    idx = np.arange(2000)
    first = train_local(m, ds.x_train, ds.y_train, idx, epochs=1, batch_size=32, lr=0.02,
                        momentum=0.9, seed=0)
    later = train_local(m, ds.x_train, ds.y_train, idx, epochs=2, batch_size=32, lr=0.02,
                        momentum=0.9, seed=1)
    assert later.mean_loss < 0.5 * first.mean_loss
    correct, total = evaluate(m, ds.x_test[:2000], ds.y_test[:2000])
    assert correct / total > 0.85
