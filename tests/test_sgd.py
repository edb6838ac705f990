"""core.ml.sgd.SGD gives torch.optim.SGD's bits on CPU, so training with it changes no model."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dtemu.core.ml.models import build_model
from dtemu.core.ml.params import flatten, sha256_of
from dtemu.core.ml.sgd import SGD


def _train(model_name, make_opt, steps=12):
    torch.manual_seed(0)
    model = build_model(model_name, 3)
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return sha256_of(flatten(model))


@pytest.mark.parametrize("model_name", ["small_cnn", "mnist_cnn"])
@pytest.mark.parametrize("momentum, weight_decay, nesterov", [(0.0, 0.0, False), (0.5, 0.0, False),
                                                              (0.9, 1e-4, False), (0.9, 1e-4, True)])
def test_the_same_bits_as_torch_optim_sgd(model_name, momentum, weight_decay, nesterov):
    kw = dict(lr=0.05, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    assert _train(model_name, lambda p: SGD(p, **kw)) == _train(model_name, lambda p: torch.optim.SGD(p, **kw))


def test_a_parameter_off_the_cpu_is_refused():
    p = torch.zeros(2, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match="CPU arithmetic"):
        SGD([p], lr=0.1)


def test_a_parameter_without_a_gradient_is_left_alone():
    a, b = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    (a * 3).sum().backward()
    SGD([a, b], lr=0.5, momentum=0.9).step()
    assert np.allclose(a.detach().numpy(), -0.5) and np.allclose(b.detach().numpy(), 1.0)
