"""BiSparse's sparsifying end: residuals with momentum correction and a sampled top-k threshold.

At a local parameter server, each round's site gradient G_t (its workers' sum
over the number of workers in all sites) goes through

    v_t = m * v_{t-1} + G_t          (velocity: momentum correction)
    u_t = u_{t-1} + v_t              (position: what is owed to the model)

and the largest entries of |u_t| are sent as (index, value) pairs; the sent
entries are zeroed in both v_t and u_t, the rest stays as the residual and is
sent when it has grown.  Because the momentum lives here, the workers apply
the aggregate with plain SGD (no momentum of their own), as in DGC.

Two of DGC's choices are settings (``geo.dense_below``, ``geo.momentum_masking``):
a tensor with fewer than ``dense_below`` entries is sent whole every round and
keeps its velocity (u_t = v_t, sent, so the workers' plain SGD is momentum SGD
for it), as DGC and GeoMX send small tensors dense; without momentum-factor
masking only u_t is zeroed where sent and v_t goes on.

The selection is DGC's (``core.compression.dgc.select_indices``): per
parameter tensor, a threshold from a random sample of ``sample_ratio`` of the
magnitudes, at most k = ceil(density * numel) entries (at least one).  The
sample is drawn from a generator seeded with (seed, site, round), so a run
repeats bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from dtemu.core.compression.kernels import select_indices


def whole_blocks(sizes: list[int], dense_below: int) -> list[tuple[int, int]]:
    """The (start, length) runs of the flat vector that BiSparse sends whole: every tensor with fewer
    than ``dense_below`` entries, neighbours merged into one run."""
    blocks: list[tuple[int, int]] = []
    off = 0
    for n in sizes:
        if n and n < dense_below:
            if blocks and blocks[-1][0] + blocks[-1][1] == off:
                blocks[-1] = (blocks[-1][0], blocks[-1][1] + n)
            else:
                blocks.append((off, n))
        off += n
    return blocks


class ResidualSparsifier:
    def __init__(self, sizes: list[int], density: float, sample_ratio: float, momentum: float,
                 seed: int, site: int, dense_below: int = 0, masking: bool = True, half_whole: bool = False):
        self.sizes = list(sizes)
        self.dense_below, self.masking = dense_below, masking
        # The whole tensors cross in half precision (BiSparse+FP16): what rounding takes off stays
        # in u, so it is sent later instead of lost (the same error feedback as the residual).
        self.blocks = whole_blocks(self.sizes, dense_below)
        self.half_whole = half_whole
        self.dim = sum(self.sizes)
        self.density, self.sample_ratio, self.momentum = density, sample_ratio, momentum
        self.seed, self.site = seed, site
        self.v = np.zeros(self.dim, np.float32)
        self.u = np.zeros(self.dim, np.float32)
        self._mask = np.empty(max(self.sizes, default=0), dtype=bool)

    def compress(self, grad: np.ndarray, round_: int, density: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Add this round's gradient; (ascending indices, values) to send (at ``density``, default
        the sparsifier's: a warm-up sends more)."""
        density = self.density if density is None else density
        if grad.shape != (self.dim,):
            raise ValueError(f"gradient of shape {grad.shape}, expected ({self.dim},)")
        self.v *= np.float32(self.momentum)
        self.v += grad
        self.u += self.v
        rng = np.random.default_rng([self.seed, self.site, round_])
        chosen, sparse, whole = [], [], []
        off = 0
        for n in self.sizes:
            if n and n < self.dense_below:   # a small tensor goes whole
                chosen.append(np.arange(off, off + n))
                whole.append(chosen[-1])
            elif n:
                k = max(1, math.ceil(density * n))
                mag = np.abs(self.u[off:off + n])
                sel = select_indices(mag, k, density, self.sample_ratio, rng, mask=self._mask[:n])
                chosen.append(sel + off)
                sparse.append(chosen[-1])
            off += n
        idx = np.concatenate(chosen) if chosen else np.zeros(0, np.int64)
        values = self.u[idx].copy()
        self.u[idx] = 0.0
        if self.half_whole and whole:
            pos = np.flatnonzero(np.isin(idx, np.concatenate(whole), assume_unique=True))
            half = values[pos].astype(np.float16).astype(np.float32)
            self.u[idx[pos]] = values[pos] - half
            values[pos] = half
        if self.masking and sparse:   # momentum factor masking; a whole tensor keeps its momentum
            self.v[np.concatenate(sparse)] = 0.0
        return idx, values
