"""The arithmetic's fingerprint: 12 hex digits that differ when a run would train another model.

Two hosts (or two settings of host.cpu_arith) train the same model from the same
scenario only if every kernel the run uses rounds alike.  This runs each kind
of arithmetic a run uses, briefly, on fixed data, and hashes what came out:

- a few SGD steps of two small CNNs written here with torch's own ops (oneDNN's
  convolutions, MKL's matrix products, ATen's elementwise kernels, reductions and
  autograd) at the run's thread count, in the shapes of the registered models;
- numpy's reductions, ``np.dot`` (OpenBLAS) and ``np.exp`` on fixed vectors
  (the codecs, the server's sums, DGC's sampling).

The reference is this module's own: it calls none of dtemu's training code
(core.ml's models, train_local, flatten), so a change there that moves a model
leaves the fingerprint where it was and the pins fail, rather than moving both
and skipping (issue 45).  tests/test_fingerprint.py pins its value for each known
host class and setting, so a change here must re-pin on purpose.

It takes about half a second (``exact``: about a second), once per process and
thread count.  Every summary.json records it under ``platform.fingerprint``.  ``start``
computes it in a thread of its own while a run goes on (emu.run): the summary, at
the run's end, then waits for it, not for the whole of it (0.3 s of a 12 s Flower run
of 50 clients on 2 cores, AMD EPYC).  Its arithmetic is the same in either thread: torch's
thread count is the process's, and it draws from a generator of its own.
"""

from __future__ import annotations

import hashlib
import threading

_cache: dict[int, str] = {}
_running: dict[int, threading.Thread] = {}
STEPS, BATCH, LR = 6, 32, 0.05
# Two networks: ((kernel, channels) of two 3x3- or 5x5-convolutions, the hidden width or None):
# MnistCnn's shapes (convolutions, pool, a 9216x128 product) and SmallCnn's (pool after each).
NETS = (((3, 32), (3, 64), 128), ((5, 16), (5, 32), None))


def fingerprint(threads: int | None = None) -> str:
    """The fingerprint at ``threads`` torch threads (default: the number in force now)."""
    import torch

    threads = threads or torch.get_num_threads()
    started = _running.pop(threads, None)
    if started is not None:
        started.join()
    if threads not in _cache:   # (also where the thread ``start`` began failed: the error shows here)
        _cache[threads] = _compute(threads)
    return _cache[threads]


def start(threads: int | None = None) -> None:
    """Begin computing the fingerprint at ``threads`` (default: those in force now) in a thread of its
    own; ``fingerprint`` then waits for it.  Nothing to do where it is known or under way."""
    import torch

    threads = threads or torch.get_num_threads()
    if threads in _cache or threads in _running:
        return

    def compute() -> None:
        try:
            _cache[threads] = _compute(threads)
        except Exception:   # noqa: BLE001 (``fingerprint`` computes it again, and raises there)
            pass

    _running[threads] = thread = threading.Thread(target=compute, name="arith-fingerprint", daemon=True)
    thread.start()


def _weights(g, net) -> list:
    import torch

    (k1, c1), (k2, c2), hidden = net
    side = (28 - k1 + 1 - k2 + 1) // 2 if hidden else ((28 - k1 + 1) // 2 - k2 + 1) // 2
    shapes = [(c1, 1, k1, k1), (c1,), (c2, c1, k2, k2), (c2,)]
    flat = c2 * side * side
    shapes += [(hidden, flat), (hidden,), (10, hidden), (10,)] if hidden else [(10, flat), (10,)]
    out = []
    for shape in shapes:
        fan_in = 1
        for d in shape[1:] or shape:
            fan_in *= d
        out.append(((torch.rand(shape, generator=g) * 2 - 1) * fan_in ** -0.5).requires_grad_())
    return out


def _forward(w: list, x, net):
    import torch.nn.functional as F

    hidden = net[2]
    h = F.relu(F.conv2d(x, w[0], w[1]))
    if not hidden:
        h = F.max_pool2d(h, 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, w[2], w[3])), 2).flatten(1)
    if hidden:
        return F.linear(F.relu(F.linear(h, w[4], w[5])), w[6], w[7])
    return F.linear(h, w[4], w[5])


def _compute(threads: int) -> str:
    import numpy as np
    import torch
    import torch.nn.functional as F

    digest = hashlib.sha256()
    before = torch.get_num_threads()
    if threads != before:   # (a thread of ``start``'s leaves the run's setting alone: it is the same)
        torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)   # its own stream: the run's is left as it was
        n = STEPS * BATCH
        x = torch.randn(n, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (n,), generator=g)
        for net in NETS:
            w = _weights(g, net)
            for step in range(STEPS):
                batch = slice(step * BATCH, (step + 1) * BATCH)
                grads = torch.autograd.grad(F.cross_entropy(_forward(w, x[batch], net), y[batch]), w)
                with torch.no_grad():
                    for p, grad in zip(w, grads):
                        p.sub_(LR * grad)
            for p in w:
                digest.update(p.detach().numpy().tobytes())
    finally:
        if threads != before:
            torch.set_num_threads(before)
    v = np.random.default_rng(0).standard_normal(100_003)
    v32 = v.astype(np.float32)
    for value in (v32.sum(), v.sum(), np.dot(v, v), np.abs(v32).max(), np.exp(v32[:4096]), np.sqrt(np.abs(v))):
        digest.update(np.asarray(value).tobytes())
    return digest.hexdigest()[:12]
