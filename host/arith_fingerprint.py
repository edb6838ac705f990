"""The arithmetic's fingerprint: 12 hex digits that differ when a run would train another model.

Two hosts (or two settings of host.cpu_arith) train the same model from the same
scenario only if every kernel the run uses rounds alike.  This runs each kind
of arithmetic a run uses, briefly, on fixed data, and hashes what came out:

- a few SGD steps of each registered CNN (oneDNN's convolutions, MKL's matrix
  products, ATen's elementwise kernels and reductions) at the run's thread count;
- numpy's reductions, ``np.dot`` (OpenBLAS) and ``np.exp`` on fixed vectors
  (the codecs, the server's sums, DGC's sampling).

It takes about a quarter of a second (``exact``: half a second), once per
process and thread count.  The pins (tests/pins.py) are keyed by it, and every
summary.json records it under ``platform.fingerprint``.
"""

from __future__ import annotations

import hashlib

_cache: dict[int, str] = {}
STEPS, BATCH = 6, 32
MODELS = ("mnist_cnn", "small_cnn")


def fingerprint(threads: int | None = None) -> str:
    """The fingerprint at ``threads`` torch threads (default: the number in force now)."""
    import torch

    threads = threads or torch.get_num_threads()
    if threads not in _cache:
        _cache[threads] = _compute(threads)
    return _cache[threads]


def _compute(threads: int) -> str:
    import numpy as np
    import torch

    from dtemu.core.ml.models import build_model
    from dtemu.core.ml.params import flatten
    from dtemu.core.ml.train import train_local

    digest = hashlib.sha256()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):  # the run's own random stream is left as it was
            g = torch.Generator().manual_seed(0)
            n = STEPS * BATCH
            x = torch.randn(n, 1, 28, 28, generator=g)
            y = torch.randint(0, 10, (n,), generator=g)
            for spec in MODELS:
                model = build_model(spec, 1)
                train_local(model, x, y, np.arange(n), epochs=1, batch_size=BATCH, lr=0.05, seed=3)
                digest.update(flatten(model).tobytes())
    finally:
        torch.set_num_threads(before)
    v = np.random.default_rng(0).standard_normal(100_003)
    v32 = v.astype(np.float32)
    for value in (v32.sum(), v.sum(), np.dot(v, v), np.abs(v32).max(), np.exp(v32[:4096]), np.sqrt(np.abs(v))):
        digest.update(np.asarray(value).tobytes())
    return digest.hexdigest()[:12]
