"""The codecs' numeric kernels (core.compression.codecs): symmetric int8 quantisation per chunk,
top-k by magnitude, how many entries top-k keeps (``topk_count``), and DGC's cheaper selection of
about k large entries by a sampled threshold (``select_indices``, geo's BiSparse's too).

Quantisation is symmetric per chunk: s = max|w| / 127, q = round(w / s), so
|w - q·s| ≤ max|w| / 254 (up to float32 rounding).  Top-k keeps the k
largest magnitudes; ties at the threshold go to the lowest index, so the same
input always selects the same entries.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def topk_count(dim: int, density: float) -> int:
    """k = ceil(density·D), at least 1 when D > 0, at most D.

    The product is taken on the decimal the user wrote (Fraction of repr), so
    density 0.1 and D = 30 give k = 3, not the 4 that 0.1*30 = 3.0000000000000004
    would give in binary floating point.
    """
    if dim <= 0:
        return 0
    k = math.ceil(Fraction(repr(float(density))) * dim)
    return min(dim, max(1, k))


def quantise(x: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 quantisation per chunk: (float32 scales, int8 codes)."""
    n = x.shape[0]
    nchunks = ceil_div(n, chunk)
    if nchunks == 0:
        return np.empty(0, np.float32), np.empty(0, np.int8)
    if n % chunk:
        # Pad the last chunk with zeros: they change neither its max nor its codes.
        padded = np.zeros(nchunks * chunk, dtype=np.float32)
        padded[:n] = x
    else:
        padded = x
    rows = padded.reshape(nchunks, chunk)
    maxabs = np.maximum(rows.max(axis=1), -rows.min(axis=1))
    scales = (maxabs / np.float32(127.0)).astype(np.float32)
    # An all-zero chunk has scale 0; divide it by 1 instead (its codes are 0 anyway).
    divisor = np.where(scales > 0, scales, np.float32(1.0))
    q = rows / divisor[:, None]
    np.rint(q, out=q)
    np.clip(q, -127.0, 127.0, out=q)
    return scales, q.reshape(-1)[:n].astype(np.int8)


def dequantise(q: np.ndarray, scales: np.ndarray, chunk: int) -> np.ndarray:
    """Inverse of quantise, into a new writable float32 array.

    A forged scale near the float32 maximum overflows to Inf here; that is not
    a malformed packet but an update whose values are not finite, which
    ``is_finite()`` reports and the aggregator rejects.
    """
    n = q.shape[0]
    out = np.empty(n, dtype=np.float32)
    full = n // chunk
    with np.errstate(over="ignore"):
        if full:
            np.multiply(
                q[: full * chunk].reshape(full, chunk),
                scales[:full, None],
                out=out[: full * chunk].reshape(full, chunk),
                dtype=np.float32,
            )
        if n > full * chunk:
            np.multiply(q[full * chunk :], scales[full], out=out[full * chunk :], dtype=np.float32)
    return out


def topk(x: np.ndarray, k: int) -> np.ndarray:
    """Ascending int64 indices of the k largest |x|; ties go to the lowest index."""
    n = x.shape[0]
    if k >= n:
        return np.arange(n, dtype=np.int64)
    mag = np.abs(x)
    threshold = np.partition(mag, n - k)[n - k]  # the k-th largest magnitude
    chosen = mag > threshold  # fewer than k of these, always
    ties = np.flatnonzero(mag == threshold)[: k - int(np.count_nonzero(chosen))]
    chosen[ties] = True
    # flatnonzero of a mask is already ascending: no sort needed.
    return np.flatnonzero(chosen).astype(np.int64, copy=False)


# Adaptation of the sampled threshold (the reference's defaults).  The
# reference's upper bound (exact top-k above 1.3·k candidates) is subsumed:
# any excess over k is cut to the exact top-k.
LOWER_BOUND = 0.8  # below 0.8·k: lower the threshold by this factor, select again
MAX_ADAPTATIONS = 10


# --- DGC's selection (core.compression.dgc; geo's BiSparse too): top-k by a sampled threshold.
#
# The per-step work is done in numpy on views of the tensors: numpy's
# compare-and-nonzero is several times faster than torch's on CPU, and its
# single-threaded ufuncs neither fight the training threads for the cores nor
# make a reduction's rounding depend on the thread count.


def sample_count(numel: int, density: float, sample_ratio: float) -> int:
    """How many |v| entries to sample; ``numel`` means select exactly.

    At least 2/density samples, so the sample's top holds about two entries
    (the reference's rule); a tensor no larger than that is selected exactly.
    """
    n = max(math.ceil(numel * sample_ratio), math.ceil(2.0 / density))
    return min(n, numel)


def _top(mag: np.ndarray, k: int) -> np.ndarray:
    """Positions (unordered) of the k largest entries of mag."""
    return np.argpartition(mag, mag.shape[0] - k)[mag.shape[0] - k:]


def select_indices(mag: np.ndarray, k: int, density: float, sample_ratio: float,
                   rng: np.random.Generator, *, mask: np.ndarray | None = None) -> np.ndarray:
    """Ascending int64 positions of at most k large entries of ``mag`` (= |v|).

    The threshold is the smallest of the top ceil(density·s) of s sampled
    magnitudes.  Below 0.8·k candidates the threshold is lowered ×0.8 and the
    selection redone, at most 10 times; above k (the reference: above 1.3·k)
    the exact top-k of the candidates is kept.  Fewer than 0.8·k come back
    only when the tensor has fewer large entries than that (e.g. zeros).
    ``mask``, a bool buffer as long as ``mag``, saves allocating one per pass.
    """
    numel = mag.shape[0]
    if k >= numel:
        return np.arange(numel, dtype=np.int64)
    s = sample_count(numel, density, sample_ratio)
    if s >= numel:
        return np.sort(_top(mag, k)).astype(np.int64, copy=False)
    sample = mag[rng.integers(0, numel, s)]
    t = topk_count(s, density)
    threshold = np.partition(sample, s - t)[s - t]
    if mask is None:
        mask = np.empty(numel, dtype=bool)
    candidates = np.flatnonzero(np.greater_equal(mag, threshold, out=mask))
    for _ in range(MAX_ADAPTATIONS):
        if candidates.shape[0] >= LOWER_BOUND * k:
            break
        threshold = threshold * np.float32(LOWER_BOUND)
        candidates = np.flatnonzero(np.greater_equal(mag, threshold, out=mask))
    # Between k and 1.3·k candidates the reference truncates by position; we
    # keep the largest, so a tensor never sends more than k entries.
    if candidates.shape[0] > k:
        candidates = np.sort(candidates[_top(mag[candidates], k)])
    return candidates.astype(np.int64, copy=False)
