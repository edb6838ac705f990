"""Models for mode ps's tests, importable as ``tests.ps_models:<factory>`` (a scenario's ``model``).

``deep_linear``: three linear layers with no nonlinearity between them.  Plain SGD at a
learning rate of 1 or more makes their product grow geometrically, so an update turns
non-finite within a few dozen iterations on the synthetic data of tests/test_ps.py (and on
MNIST): a diverging run on demand, deterministic for a seed.
"""

from torch import nn


def deep_linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.Linear(16, 16), nn.Linear(16, 10))
