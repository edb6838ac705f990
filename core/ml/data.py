"""Data sets as tensors, parsed from bytes, and split between clients: pure logic.

Where the archives live, fetching and checking them, and reading files are
the host's (``host/datasets.py``); this module gets bytes and arrays.  MNIST
and Fashion-MNIST are parsed from their IDX format with numpy (no
torchvision).

Every partitioner is a pure function of its inputs and a seed, so the emulator
and the real deployment hand every client the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dtemu.core.errors import DataError

# ---------------------------------------------------------------------------
# IDX, from bytes
# ---------------------------------------------------------------------------

# IDX magic: two zero bytes, a type code (0x08 = uint8), the number of dims.
_IDX_DIMS = {0x00000801: 1, 0x00000803: 3}


def parse_idx(data: bytes, where: str = "IDX") -> np.ndarray:
    """Parse the (gunzipped) bytes of an IDX file of uint8 labels (1-D) or images (3-D)."""
    if len(data) < 4:
        raise DataError(f"{where}: too short for an IDX header ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    ndim = _IDX_DIMS.get(magic)
    if ndim is None:
        raise DataError(f"{where}: bad IDX magic 0x{magic:08x}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{where}: truncated IDX header")
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if any(d == 0 for d in dims):
        raise DataError(f"{where}: IDX has an empty dimension {dims}")
    want = header + int(np.prod(dims))
    if len(data) != want:
        raise DataError(f"{where}: IDX dims {dims} need {want} bytes, file has {len(data)}")
    # A copy, so callers get a writable array that torch can wrap without warning.
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims).copy()


# ---------------------------------------------------------------------------
# Data sets as preloaded tensors
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Dataset:
    """A whole data set in memory.  x: float32 (N, C, H, W), y: int64 (N,).

    Shared by every client in a process: treat the tensors as read-only.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    def to(self, device: str) -> Dataset:
        """The same data on ``device`` (itself where it already is: the CPU's tensors are not copied)."""
        if self.x_train.device == torch.device(device):
            return self
        return Dataset(self.name, *(t.to(device) for t in (self.x_train, self.y_train, self.x_test, self.y_test)))


def images_and_labels(images: np.ndarray, labels: np.ndarray, mean: float, std: float,
                      where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """28x28 uint8 images and their labels (from IDX) as normalised tensors, checked."""
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{where}: images are {images.shape}, not (N, 28, 28)")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"{where}: {len(images)} images but labels {labels.shape}")
    if labels.max() > 9:
        raise DataError(f"{where}: label {labels.max()} out of range 0..9")
    # Same arithmetic as torchvision's ToTensor() + Normalize((mean,), (std,)).
    x = torch.from_numpy(images).to(torch.float32).div_(255.0)
    return x.sub_(mean).div_(std).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def _as_images(a, spec: str) -> torch.Tensor:
    x = torch.as_tensor(np.asarray(a) if not torch.is_tensor(a) else a).to(torch.float32)
    if x.ndim == 3:  # (N, H, W): add the channel dimension the models expect
        x = x.unsqueeze(1)
    if x.ndim != 4:
        raise DataError(f"{spec}: images must be (N, C, H, W) or (N, H, W), got {tuple(x.shape)}")
    return x


def _as_labels(a, spec: str) -> torch.Tensor:
    y = torch.as_tensor(np.asarray(a) if not torch.is_tensor(a) else a)
    if y.is_floating_point() or y.ndim != 1:
        raise DataError(f"{spec}: labels must be a 1-D integer array, "
                        f"got {y.dtype} {tuple(y.shape)}")
    return y.to(torch.int64)


def dataset_from(out, spec: str) -> Dataset:
    """What a data factory returned (a Dataset, or (x_train, y_train, x_test, y_test)), checked."""
    if isinstance(out, Dataset):
        return out
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        raise DataError(f"data factory {spec!r} returned {type(out).__name__}, "
                        "not a Dataset or a 4-tuple")
    x_train, x_test = _as_images(out[0], spec), _as_images(out[2], spec)
    y_train, y_test = _as_labels(out[1], spec), _as_labels(out[3], spec)
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise DataError(f"data factory {spec!r}: images and labels differ in length")
    return Dataset(spec, x_train, y_train, x_test, y_test)


def task_dataset(out, spec: str) -> Dataset:
    """What a task's ``data()`` returned (core.ml.task), checked: a Dataset, or (x_train, y_train,
    x_test, y_test) of any shapes, N samples along the first dimension.  Inputs and targets keep
    what they are: floating point as float32, integers (token ids, labels) as int64."""
    if not isinstance(out, (Dataset, tuple, list)) or (not isinstance(out, Dataset) and len(out) != 4):
        raise DataError(f"task {spec!r}: data() returned {type(out).__name__}, not a Dataset or a 4-tuple")
    parts = (out.x_train, out.y_train, out.x_test, out.y_test) if isinstance(out, Dataset) else out
    tensors = []
    for name, a in zip(("x_train", "y_train", "x_test", "y_test"), parts):
        t = a if torch.is_tensor(a) else torch.as_tensor(np.asarray(a))
        if t.ndim < 1 or len(t) == 0:
            raise DataError(f"task {spec!r}: {name} is empty or a scalar ({tuple(t.shape)})")
        if t.is_floating_point():
            t = t.to(torch.float32)
        elif t.dtype != torch.bool:
            t = t.to(torch.int64)
        tensors.append(t)
    if len(tensors[0]) != len(tensors[1]) or len(tensors[2]) != len(tensors[3]):
        raise DataError(f"task {spec!r}: inputs and targets differ in length")
    return Dataset(spec, *tensors)


# ---------------------------------------------------------------------------
# Splitting between clients
# ---------------------------------------------------------------------------


def _check_clients(n: int, clients: int) -> None:
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if n < clients:
        raise DataError(f"cannot give {clients} clients a sample each from {n} samples")


def _labels(labels) -> np.ndarray:
    return np.asarray(labels.cpu() if torch.is_tensor(labels) else labels).reshape(-1)


def partition_iid(n: int, clients: int, seed: int) -> list[np.ndarray]:
    """A random split of ``range(n)`` into ``clients`` parts whose sizes differ
    by at most one.  Each part is sorted."""
    _check_clients(n, clients)
    perm = np.random.default_rng(seed).permutation(n)
    return [np.sort(p).astype(np.int64) for p in np.array_split(perm, clients)]


def partition_shards(labels, clients: int, seed: int,
                     shards_per_client: int = 2) -> list[np.ndarray]:
    """McMahan et al.'s pathological non-IID split: sort by label, cut into
    ``clients * shards_per_client`` shards of (nearly) equal size, and deal
    each client ``shards_per_client`` random shards.  A shard spans at most
    two labels, so a client holds at most ``2 * shards_per_client``."""
    labels = _labels(labels)
    if shards_per_client < 1:
        raise ValueError(f"shards_per_client must be >= 1, got {shards_per_client}")
    _check_clients(len(labels), clients)
    n_shards = clients * shards_per_client
    if len(labels) < n_shards:
        raise DataError(f"cannot cut {len(labels)} samples into {n_shards} shards")
    order = np.argsort(labels, kind="stable")
    shards = np.array_split(order, n_shards)
    deal = np.random.default_rng(seed).permutation(n_shards).reshape(clients, shards_per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])).astype(np.int64) for row in deal]


def partition_dirichlet(labels, clients: int, seed: int, alpha: float) -> list[np.ndarray]:
    """Label skew after Hsu et al.: for each class, the share of each client
    is drawn from Dir(alpha).  Small alpha = few classes per client.

    A client left with no samples gets one moved from the largest client, so
    every client can train; this barely changes the drawn distribution."""
    labels = _labels(labels)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    _check_clients(len(labels), clients)
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for k in np.unique(labels):
        idx = np.flatnonzero(labels == k)
        rng.shuffle(idx)
        share = rng.dirichlet(np.full(clients, alpha))
        cuts = np.minimum((np.cumsum(share)[:-1] * len(idx)).astype(np.int64), len(idx))
        for c, chunk in enumerate(np.split(idx, cuts)):
            parts[c].append(chunk)
    out = [np.concatenate(p).astype(np.int64) for p in parts]
    for c in range(clients):
        if len(out[c]) == 0:
            big = max(range(clients), key=lambda i: len(out[i]))
            j = int(rng.integers(len(out[big])))
            out[c] = out[big][j: j + 1]
            out[big] = np.delete(out[big], j)
    return [np.sort(p) for p in out]


PARTITION_KINDS = ("iid", "shards", "dirichlet")


def partition(kind: str, labels, clients: int, seed: int, alpha: float = 0.5,
              shards_per_client: int = 2) -> list[np.ndarray]:
    """One int64 index array per client, by ``kind`` (see PARTITION_KINDS)."""
    if kind == "iid":
        return partition_iid(len(_labels(labels)), clients, seed)
    if kind == "shards":
        return partition_shards(labels, clients, seed, shards_per_client)
    if kind == "dirichlet":
        return partition_dirichlet(labels, clients, seed, alpha)
    raise ValueError(f"unknown partition kind {kind!r}; known: {', '.join(PARTITION_KINDS)}")


def round_subset(indices, subset: int | None, seed: int, round_: int, client: int) -> np.ndarray:
    """The samples a client trains on in one round: ``subset`` of its
    ``indices`` drawn without replacement, or all of them shuffled.  Seeded by
    (seed, round, client) alone, so it does not depend on which other clients
    were picked or in what order they run."""
    indices = np.asarray(indices, dtype=np.int64)
    rng = np.random.default_rng([seed, round_, client])
    if subset is None or subset >= len(indices):
        return rng.permutation(indices)
    if subset < 1:
        raise ValueError(f"subset must be >= 1 or None, got {subset}")
    return rng.choice(indices, size=subset, replace=False)
