"""Data sets on this machine: where the archives live, fetching and checking them, loading them.

The I/O half of ``core/ml/data.py`` (which parses bytes and splits data
between clients).  The folder layout is torchvision's
(``<root>/MNIST/raw/*.gz``, ``<root>/FashionMNIST/raw/*.gz``) so a folder that
torchvision already filled works as it is.  The runtimes call ``load_for``
and hand the data set to the scenario's ``Workload``.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.client
import logging
import os
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from dtemu.core.errors import DataError
from dtemu.core.ml import user_code
from dtemu.core.ml.data import Dataset, dataset_from, images_and_labels, parse_idx, task_dataset
from dtemu.core.scenario import Scenario

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


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp:
        return resp.read()


def _md5(blob: bytes = b""):
    # An integrity check, not security: allowed on FIPS-restricted builds too.
    return hashlib.md5(blob, usedforsecurity=False)


def _md5_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, _md5).hexdigest()


def check_present(path: Path, want: str) -> None:
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


MNIST_HINT = "MNIST/raw/*.gz or FashionMNIST/raw/*.gz"


def download(path: Path, mirrors: Sequence[str], want: str,
             fetch: Callable[[str], bytes], holding: str = MNIST_HINT) -> None:
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
    raise DataError(f"{path}: could not fetch a good copy; " + "; ".join(problems)
                    + f". To use archives you already have, copy them into {path.parent} or point $DTEMU_DATA "
                    f"(or the scenario's data.root) at a folder holding {holding}")


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
            check_present(path, want)
        else:
            download(path, src.mirrors, want, fetch or http_get)
    return folder


# ---------------------------------------------------------------------------
# Reading IDX archives
# ---------------------------------------------------------------------------


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse a gzip IDX file of uint8 labels (1-D) or images (3-D)."""
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise DataError(f"{path}: not a readable gzip file: {e}") from e
    return parse_idx(data, str(path))


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _load_split(folder: Path, prefix: str, src: _Source):
    images = read_idx(folder / f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz")
    return images_and_labels(images, labels, src.mean, src.std, f"{folder}: {prefix}")


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


@functools.lru_cache(maxsize=4)
def load_dataset_factory(spec: str) -> Dataset:
    """A scenario's own data: ``package.module:factory`` called with no
    arguments, returning a Dataset or (x_train, y_train, x_test, y_test)."""
    factory = user_code.load("data.factory", spec, "data factory")
    return dataset_from(user_code.call("data.factory", spec, "data factory", factory), spec)


@functools.lru_cache(maxsize=4)
def load_task_data(spec: str) -> Dataset:
    """A task's data (core.ml.task), once per process; what it returned checked."""
    from dtemu.core.ml.task import load_task  # torch: only when a task's data is needed

    return task_dataset(load_task(spec).data(), spec)


def load_for(scenario: Scenario) -> Dataset:
    """The data set a scenario names: its task's, its factory's, or MNIST / Fashion-MNIST from its root."""
    spec = scenario.data
    if scenario.task:
        return load_task_data(scenario.task)
    if spec.factory:
        return load_dataset_factory(spec.factory)
    return load_dataset(spec.dataset, resolve_root(spec.root))
