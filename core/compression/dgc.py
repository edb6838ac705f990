"""Deep Gradient Compression (Lin et al., ICLR 2018) for data-parallel SGD.

Each rank turns one step's gradients into a ``Bucket`` (``core/wire/bucket.py``);
every rank averages all ranks' buckets and applies the result with ``DGCSGD``.
The six parts of the paper, and where they live:

- sparsification by a sampled threshold: ``select_indices`` (core.compression.kernels);
- momentum correction and local gradient accumulation: ``DGCCompressor``
  keeps per tensor a momentum u and an accumulated velocity v,
  u = m·u + g; v = v + u (Nesterov: u = m·(u + g); v = v + u + g), and sends
  the largest entries of v;
- momentum-factor masking: u and v are zeroed where sent;
- local gradient clipping: the rank's whole gradient (all tensors, one norm)
  is clipped to clip_norm · N^(-1/2) before it is accumulated;
- warm-up: ``DGCConfig.density_at`` (core.compression.dgc_config), density 25%, 6.25%, 1.5625%, 0.4%, then
  the final density, one stage per ``warmup_steps_per_stage`` steps;
- small tensors (numel < ``dense_below``, e.g. biases) are sent dense.

Decisions where the paper leaves room (they follow the reference code,
synxlin/deep-gradient-compression, unless said otherwise):

- Dense tensors are sent as the plain clipped gradient; the momentum is
  applied after averaging, by ``DGCSGD``, identically on every rank.  Running
  them through u and v with masking would zero u at every send, i.e. drop
  momentum altogether.
- Weight decay is not compressed: ``DGCSGD`` applies wd·w with its own
  momentum buffer.  The weights are identical on every rank, so this term
  needs no communication, and adding it to the gradient would spend the tiny
  top-k budget on a dense, smooth term.
- At most k entries are sent (the reference truncates too), but where the
  reference keeps the first k candidates by position we keep the k largest.
  So a bucket never exceeds its k-entry budget.
- fp16 values: the rounding error of a sent value stays in v (error feedback),
  so nothing is lost; dense tensors lose their fp16 rounding, as in the
  reference.
- ``density >= 1`` is the dense baseline: every tensor sent dense, and
  ``DGCSGD`` is then plain momentum SGD on the averaged gradient.

Everything random (the threshold's sample) is drawn from a generator seeded
with (seed, rank, step), so a run repeats bit for bit.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from dtemu.core.wire.bucket import DENSE, SPARSE, Bucket, Shapes, TensorPayload, numels
from dtemu.core.compression.dgc_config import PAPER_WARMUP, DGCConfig, param_shapes  # noqa: F401 (DGC's own, kept at hand)
from dtemu.core.compression.kernels import select_indices, topk_count
from dtemu.core.errors import RejectedUpdate


# ---------------------------------------------------------------- compressor


def _clip_coefficient(flat: list[np.ndarray], clip_norm: float | None, world_size: int) -> float:
    """Scale for the rank's gradient; ValueError if it is not finite.

    The norm is computed even without clipping: a NaN or Inf must not get
    into the accumulated velocity, which would then poison every later step.
    einsum rather than np.dot: BLAS may thread, and its rounding with it.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        total = math.sqrt(sum(float(np.einsum("i,i->", f, f)) for f in flat))
    if not math.isfinite(total):
        raise ValueError("gradient has NaN or Inf entries")
    if clip_norm is None:
        return 1.0
    return min(clip_norm / math.sqrt(world_size) / (total + 1e-6), 1.0)


class DGCCompressor:
    """One rank's DGC state: momentum u and velocity v of each sparse tensor."""

    def __init__(self, shapes: Shapes, config: DGCConfig, world_size: int, rank: int):
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world size {world_size}")
        self.shapes = [(name, tuple(shape)) for name, shape in shapes]
        self.config = config
        self.world_size = world_size
        self.rank = rank
        self.numels = numels(self.shapes)
        self.kinds = config.kinds(self.shapes)
        sparse = [kd == SPARSE for kd in self.kinds]
        self._u = [np.zeros(n, np.float32) if sp else None for n, sp in zip(self.numels, sparse)]
        self._v = [np.zeros(n, np.float32) if sp else None for n, sp in zip(self.numels, sparse)]
        # Scratch for |v| (and the clipped gradient before it) and the
        # threshold mask, reused every step: a fresh multi-MB array each time
        # costs more in page faults than the arithmetic.
        largest = max((n for n, sp in zip(self.numels, sparse) if sp), default=0)
        self._scratch = np.empty(largest, np.float32)
        self._mask = np.empty(largest, dtype=bool)

    def density_at(self, step: int) -> float:
        return self.config.density_at(step)

    def momentum(self, i: int) -> torch.Tensor | None:
        """Flat momentum u of tensor i (None for a dense tensor); a live view."""
        return None if self._u[i] is None else torch.from_numpy(self._u[i])

    def velocity(self, i: int) -> torch.Tensor | None:
        """Flat accumulated velocity v of tensor i, what is not sent yet; a live view."""
        return None if self._v[i] is None else torch.from_numpy(self._v[i])

    def _flatten(self, grads: Sequence[torch.Tensor]) -> list[np.ndarray]:
        if len(grads) != len(self.numels):
            raise ValueError(f"{len(grads)} gradients for {len(self.numels)} tensors")
        flat = []
        for (name, _), n, g in zip(self.shapes, self.numels, grads):
            if g.numel() != n:
                raise ValueError(f"gradient of {name} has {g.numel()} elements, expected {n}")
            # A view where possible (on the CPU; a GPU's gradient comes over); never written to.
            flat.append(g.detach().reshape(-1).to(torch.float32).cpu().numpy())
        return flat

    def _accumulate(self, i: int, g: np.ndarray, coef: float) -> np.ndarray:
        """Momentum correction and local accumulation of coef·g; returns v."""
        u, v, m = self._u[i], self._v[i], np.float32(self.config.momentum)
        if coef != 1.0:
            g = np.multiply(g, np.float32(coef), out=self._scratch[: g.shape[0]])
        if self.config.nesterov:
            u += g
            u *= m
            v += u
            v += g
        else:
            u *= m
            u += g
            v += u
        return v

    def _send_sparse(self, i: int, v: np.ndarray, k: int, density: float,
                     rng: np.random.Generator) -> TensorPayload:
        n = v.shape[0]
        mag = np.abs(v, out=self._scratch[:n])
        idx = select_indices(mag, k, density, self.config.sample_ratio, rng, mask=self._mask[:n])
        values = v[idx]
        if self.config.fp16_values:
            sent = values.astype(np.float16).astype(np.float32)
            # Keep the rounding error for a later step (not an overflow to Inf).
            with np.errstate(invalid="ignore"):
                v[idx] = np.where(np.isfinite(sent), values - sent, np.float32(0))
        else:
            sent = values
            v[idx] = 0
        self._u[i][idx] = 0  # momentum-factor masking
        return TensorPayload(v.shape[0], torch.from_numpy(sent), torch.from_numpy(idx))

    def _send_dense(self, g: np.ndarray, coef: float) -> TensorPayload:
        values = g * np.float32(coef) if coef != 1.0 else g.copy()
        if self.config.fp16_values:
            values = values.astype(np.float16).astype(np.float32)
        return TensorPayload(values.shape[0], torch.from_numpy(values))

    def compress(self, grads: Sequence[torch.Tensor], step: int) -> Bucket:
        """This rank's bucket for ``step``; grads in the order of ``shapes``.

        ValueError (and no state change) for a wrong count, size or a
        non-finite gradient.
        """
        flat = self._flatten(grads)
        coef = _clip_coefficient(flat, self.config.clip_norm, self.world_size)
        density = self.density_at(step)
        rng = np.random.default_rng([self.config.seed, self.rank, step])
        payloads = []
        for i, g in enumerate(flat):
            if self.kinds[i] == DENSE:
                payloads.append(self._send_dense(g, coef))
            else:
                v = self._accumulate(i, g, coef)
                k = topk_count(self.numels[i], density)
                payloads.append(self._send_sparse(i, v, k, density, rng))
        return Bucket(self.rank, step, self.world_size, self.config.fp16_values, payloads)


# ---------------------------------------------------------------- aggregation


def check_bucket(bucket: Bucket, shapes: Shapes, world_size: int) -> None:
    """RejectedUpdate if ``bucket`` must not be averaged into this model's step."""
    who = f"bucket from rank {bucket.rank}"
    if bucket.world_size != world_size or not 0 <= bucket.rank < world_size:
        raise RejectedUpdate(f"{who}: world size {bucket.world_size}, expected {world_size}")
    expected = numels(shapes)
    if len(bucket.payloads) != len(expected):
        raise RejectedUpdate(f"{who}: {len(bucket.payloads)} tensors, the model has {len(expected)}")
    for i, (p, n) in enumerate(zip(bucket.payloads, expected)):
        if p.numel != n:
            raise RejectedUpdate(f"{who}: tensor {i} has numel {p.numel}, expected {n}")
        if p.indices is None:
            if p.values.shape != (n,):
                raise RejectedUpdate(f"{who}: dense tensor {i} has {tuple(p.values.shape)} values for {n}")
        elif p.indices.shape != p.values.shape or p.values.dim() != 1:
            raise RejectedUpdate(f"{who}: tensor {i} has {tuple(p.indices.shape)} indices, "
                                 f"{tuple(p.values.shape)} values")
        elif p.indices.numel() and (int(p.indices.min()) < 0 or int(p.indices.max()) >= n):
            raise RejectedUpdate(f"{who}: tensor {i} index out of range [0, {n})")
    if not bucket.is_finite():
        raise RejectedUpdate(f"{who}: values are not finite")


def average_buckets(buckets: Sequence[Bucket], shapes: Shapes, world_size: int) -> list[torch.Tensor]:
    """Sum of every bucket's payloads divided by the world size, shaped per tensor.

    Summed in float32 in rank order, whatever order the buckets arrived in, so
    two runtimes get bit-identical results.  A missing rank counts as zeros.
    All buckets are checked before any is summed (RejectedUpdate otherwise).
    """
    ordered = sorted(buckets, key=lambda b: b.rank)
    for a, b in zip(ordered, ordered[1:]):
        if a.rank == b.rank:
            raise RejectedUpdate(f"two buckets from rank {a.rank}")
    if len({b.step for b in ordered}) > 1:
        raise RejectedUpdate(f"buckets of different steps {sorted({b.step for b in ordered})}")
    for b in ordered:
        check_bucket(b, shapes, world_size)
    sums = [torch.zeros(n) for n in numels(shapes)]
    for b in ordered:
        for total, p in zip(sums, b.payloads):
            if p.indices is None:
                total.add_(p.values)
            else:
                # Indices are distinct within a payload, so index_add_ has no
                # order of its own to depend on.
                total.index_add_(0, p.indices, p.values)
    return [total.div_(world_size).view(shape) for total, (_, shape) in zip(sums, shapes)]


# ---------------------------------------------------------------- optimizer


class DGCSGD:
    """Applies the averaged step: w -= lr · (update + momentum(wd · w)).

    Sparse tensors' updates are already momentum-corrected (by the ranks'
    compressors), so no second momentum is applied to them; dense tensors get
    their momentum here, on the averaged gradient.  Weight decay has its own
    momentum buffer (as in the reference's DGCSGD): the weights are the same on
    every rank, so it needs no communication.
    """

    def __init__(self, shapes: Shapes, config: DGCConfig):
        self.shapes = [(name, tuple(shape)) for name, shape in shapes]
        self.config = config
        self.kinds = config.kinds(self.shapes)
        self._grad_momentum: list[torch.Tensor | None] = [None] * len(self.shapes)
        self._decay_momentum: list[torch.Tensor | None] = [None] * len(self.shapes)

    def _momentum(self, buffers: list, i: int, d: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """Heavy-ball or Nesterov momentum of scale·d, with buffer ``buffers[i]``.

        The heavy-ball result is the buffer itself (read-only for the caller):
        no copy of a 1.2M-entry tensor per step.
        """
        m = self.config.momentum
        if m == 0:
            return d * scale if scale != 1.0 else d
        if buffers[i] is None:
            buffers[i] = torch.zeros_like(d)
        buf = buffers[i]
        buf.mul_(m).add_(d, alpha=scale)
        if self.config.nesterov:
            return buf.mul(m).add_(d, alpha=scale)
        return buf

    def buffers(self) -> list[torch.Tensor | None]:
        """The momentum buffers (None until first used): per tensor the gradient's, then the decay's."""
        return self._grad_momentum + self._decay_momentum

    def load_buffers(self, buffers: Sequence[torch.Tensor | None]) -> None:
        """The inverse of ``buffers`` (a survivor takes its group leader's state)."""
        n = len(self.shapes)
        if len(buffers) != 2 * n:
            raise ValueError(f"{len(buffers)} buffers for {n} tensors (want {2 * n})")
        self._grad_momentum, self._decay_momentum = list(buffers[:n]), list(buffers[n:])

    @torch.no_grad()
    def step(self, params: Sequence[torch.Tensor], averaged: Sequence[torch.Tensor], lr: float) -> None:
        if len(params) != len(self.shapes) or len(averaged) != len(self.shapes):
            raise ValueError(f"{len(params)} params and {len(averaged)} updates "
                             f"for {len(self.shapes)} tensors")
        wd = self.config.weight_decay
        for i, (p, a) in enumerate(zip(params, averaged)):
            d = a.reshape(p.shape).to(p.device)   # (the buckets are summed on the CPU)
            if self.kinds[i] == DENSE:
                d = self._momentum(self._grad_momentum, i, d)
            # the decay term is taken from the weights before this step's update
            decay = self._momentum(self._decay_momentum, i, p, scale=wd) if wd else None
            p.add_(d, alpha=-lr)
            if decay is not None:
                p.add_(decay, alpha=-lr)
