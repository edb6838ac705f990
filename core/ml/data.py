"""Data sets: where they live, fetching and checking the archives, reading
them, and splitting them between clients.

MNIST and Fashion-MNIST are read straight from their gzip IDX archives with
numpy (no torchvision).  The folder layout is torchvision's
(``<root>/MNIST/raw/*.gz``, ``<root>/FashionMNIST/raw/*.gz``) so a folder that
torchvision already filled works as it is.

Every partitioner is a pure function of its inputs and a seed, so the emulator
and the real deployment hand every client the same samples.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.client
import importlib
import logging
import os
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from dtemu.core.errors import DataError

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------
# Where the archives live
# ---------------------------------------------------------------------------


def resolve_root(scenario_root: str | os.PathLike | None) -> Path:
    """The data root: the scenario's ``data.root``, else ``$DTEMU_DATA``,
    else a per-user cache (``$XDG_CACHE_HOME/dtemu`` or ``~/.cache/dtemu``)."""
    if scenario_root:
        return Path(scenario_root).expanduser()
    env = os.environ.get("DTEMU_DATA")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "dtemu"


@dataclass(frozen=True)
class _Source:
    folder: str  # torchvision's folder name under the root
    mirrors: tuple[str, ...]  # tried in order
    md5: dict[str, str]  # archive file name -> torchvision's MD5
    mean: float  # of the training pixels scaled to [0, 1]
    std: float


# URLs and MD5s are torchvision's, so archives fetched by either tool agree.
SOURCES: dict[str, _Source] = {
    "mnist": _Source(
        folder="MNIST",
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        md5={
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
        mean=0.1307,
        std=0.3081,
    ),
    "fashion_mnist": _Source(
        folder="FashionMNIST",
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        md5={
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
        mean=0.2860,
        std=0.3530,
    ),
}

_DOWNLOAD_TIMEOUT_S = 60.0

# Archives already checked in this process, keyed by (path, size, mtime) so a
# file replaced behind our back is checked again.  Several emulated clients
# call ensure_archives; only the first one pays for the MD5.
_verified: set[tuple[str, int, int]] = set()


def _source(dataset: str) -> _Source:
    try:
        return SOURCES[dataset]
    except KeyError:
        raise DataError(
            f"unknown data set {dataset!r}; known: {', '.join(sorted(SOURCES))}"
        ) from None


def raw_dir(root: str | os.PathLike, dataset: str) -> Path:
    """The folder holding a data set's gz archives under ``root``."""
    return Path(root) / _source(dataset).folder / "raw"


def _http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp:
        return resp.read()


def _md5(blob: bytes = b""):
    # An integrity check, not security: allowed on FIPS-restricted builds too.
    return hashlib.md5(blob, usedforsecurity=False)


def _md5_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, _md5).hexdigest()


def _check_present(path: Path, want: str) -> None:
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key in _verified:
            return
        got = _md5_file(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read the archive: {e}") from e
    if got != want:
        # Never rewritten here: the root may be shared and read-only.
        raise DataError(
            f"{path}: MD5 {got} does not match the expected {want}; "
            "delete the file to have it downloaded again"
        )
    _verified.add(key)


def _download(path: Path, mirrors: Sequence[str], want: str,
              fetch: Callable[[str], bytes]) -> None:
    problems = []
    for base in mirrors:
        url = base + path.name
        log.info("downloading %s", url)
        try:
            blob = fetch(url)
        except (OSError, http.client.HTTPException, ValueError) as e:
            problems.append(f"{url}: {e}")
            continue
        got = _md5(blob).hexdigest()
        if got != want:
            # A mirror serving an error page or a changed file: try the next.
            problems.append(f"{url}: MD5 {got} != expected {want}")
            continue
        _write_atomically(path, blob)
        st = path.stat()
        _verified.add((str(path.resolve()), st.st_size, st.st_mtime_ns))
        return
    raise DataError(f"{path}: could not fetch a good copy; " + "; ".join(problems))


def _write_atomically(path: Path, blob: bytes) -> None:
    # A temp file in the same folder, then a rename: a reader never sees a
    # half-written archive, even if two processes download at once.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    except OSError as e:
        raise DataError(f"{path}: cannot write the archive: {e}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a data cache is for everyone
        os.replace(tmp, path)
    except OSError as e:
        raise DataError(f"{path}: cannot write the archive: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ensure_archives(root: str | os.PathLike, dataset: str,
                    fetch: Callable[[str], bytes] | None = None) -> Path:
    """Make sure the four archives of ``dataset`` are under ``root``, each with
    torchvision's MD5, and return their folder.

    Missing archives are fetched from the mirrors with ``fetch(url) -> bytes``
    (an HTTP GET unless given); present ones are only checked, never rewritten.
    """
    src = _source(dataset)
    folder = raw_dir(root, dataset)
    for name, want in src.md5.items():
        path = folder / name
        if path.is_file():
            _check_present(path, want)
        else:
            _download(path, src.mirrors, want, fetch or _http_get)
    return folder


# ---------------------------------------------------------------------------
# Reading IDX archives
# ---------------------------------------------------------------------------

# IDX magic: two zero bytes, a type code (0x08 = uint8), the number of dims.
_IDX_DIMS = {0x00000801: 1, 0x00000803: 3}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse a gzip IDX file of uint8 labels (1-D) or images (3-D)."""
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise DataError(f"{path}: not a readable gzip file: {e}") from e
    if len(data) < 4:
        raise DataError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    ndim = _IDX_DIMS.get(magic)
    if ndim is None:
        raise DataError(f"{path}: bad IDX magic 0x{magic:08x}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if any(d == 0 for d in dims):
        raise DataError(f"{path}: IDX has an empty dimension {dims}")
    want = header + int(np.prod(dims))
    if len(data) != want:
        raise DataError(f"{path}: IDX dims {dims} need {want} bytes, file has {len(data)}")
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


def _images(raw: np.ndarray, mean: float, std: float) -> torch.Tensor:
    # Same arithmetic as torchvision's ToTensor() + Normalize((mean,), (std,)).
    x = torch.from_numpy(raw).to(torch.float32).div_(255.0)
    return x.sub_(mean).div_(std).unsqueeze(1)


def _load_split(folder: Path, prefix: str, src: _Source) -> tuple[torch.Tensor, torch.Tensor]:
    images = read_idx(folder / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz")
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{folder}: {prefix} images are {images.shape}, not (N, 28, 28)")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataError(f"{folder}: {len(images)} {prefix} images but labels {labels.shape}")
    if labels.max() > 9:
        raise DataError(f"{folder}: {prefix} label {labels.max()} out of range 0..9")
    return _images(images, src.mean, src.std), torch.from_numpy(labels.astype(np.int64))


@functools.lru_cache(maxsize=4)
def _load_cached(name: str, root: Path) -> Dataset:
    src = _source(name)
    folder = ensure_archives(root, name)
    x_train, y_train = _load_split(folder, "train", src)
    x_test, y_test = _load_split(folder, "t10k", src)
    return Dataset(name, x_train, y_train, x_test, y_test)


def load_dataset(name: str, root: str | os.PathLike | None = None) -> Dataset:
    """Load "mnist" or "fashion_mnist" from ``root`` (see resolve_root),
    fetching missing archives.  Cached per process: every emulated client in
    it shares the same tensors."""
    return _load_cached(name, resolve_root(root).resolve())


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


@functools.lru_cache(maxsize=4)
def load_dataset_factory(spec: str) -> Dataset:
    """A scenario's own data: ``package.module:factory`` called with no
    arguments, returning a Dataset or (x_train, y_train, x_test, y_test)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise DataError(f"data factory {spec!r} is not of the form package.module:factory")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise DataError(f"data factory {spec!r} cannot be imported: {e}") from e
    out = factory()
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
