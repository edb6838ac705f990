"""CIFAR-10 on this machine: where its binary archive lives, fetching and checking it, reading it.

Under the data root (host.datasets.resolve_root) it is found, in order, as:

- the extracted folder ``cifar-10-batches-bin/`` (the archive's own layout); its files are
  checked by their format (core.ml.cifar), not by a checksum: a folder of your own, or the
  small synthetic one the tests write, works as it is;
- the archive ``cifar-10-binary.tar.gz``, checked against its published MD5 and read in
  place (only its six batch files, each a regular file of whole records);
- else downloaded from its home page and checked, as MNIST is.
"""

from __future__ import annotations

import functools
import tarfile
from pathlib import Path

import numpy as np

from dtemu.core.errors import DataError
from dtemu.core.ml import cifar
from dtemu.core.ml.data import Dataset
from dtemu.host.datasets import check_present, download, http_get, resolve_root

ARCHIVE = "cifar-10-binary.tar.gz"
MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
MIRRORS = ("https://www.cs.toronto.edu/~kriz/",)
MAX_FILE = 10_000 * cifar.RECORD  # one batch file


def load_cifar10(root=None, fetch=None) -> Dataset:
    """CIFAR-10, normalised, from ``root`` (the data root when None); cached per process."""
    return _load(resolve_root(root).resolve(), fetch)


@functools.lru_cache(maxsize=2)
def _load(root: Path, fetch) -> Dataset:
    files = _read_folder(root / cifar.FOLDER) if (root / cifar.FOLDER).is_dir() else _read_archive(root, fetch)
    train = [cifar.parse_batch(files[name], name) for name in cifar.TRAIN_FILES]
    images = [i for i, _ in train]
    labels = [lab for _, lab in train]
    x_train, y_train = cifar.to_tensors(np.concatenate(images), np.concatenate(labels))
    x_test, y_test = cifar.to_tensors(*cifar.parse_batch(files[cifar.TEST_FILE], cifar.TEST_FILE))
    return Dataset("cifar10", x_train, y_train, x_test, y_test)


def _names() -> tuple[str, ...]:
    return (*cifar.TRAIN_FILES, cifar.TEST_FILE)


def _read_folder(folder: Path) -> dict[str, bytes]:
    out = {}
    for name in _names():
        path = folder / name
        try:
            if path.stat().st_size > MAX_FILE:
                raise DataError(f"{path}: larger than one batch ({MAX_FILE:,} bytes)")
            out[name] = path.read_bytes()
        except OSError as err:
            raise DataError(f"{path}: cannot read CIFAR-10's batch: {err.strerror}") from None
    return out


def _read_archive(root: Path, fetch) -> dict[str, bytes]:
    path = root / ARCHIVE
    if path.is_file():
        check_present(path, MD5)
    else:
        download(path, MIRRORS, MD5, fetch or http_get, holding=f"{ARCHIVE} or {cifar.FOLDER}/")
    out = {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                name = Path(member.name).name
                if name in _names() and member.isfile() and 0 < member.size <= MAX_FILE:
                    out[name] = tar.extractfile(member).read()
    except (OSError, tarfile.TarError) as err:
        raise DataError(f"{path}: cannot read the archive: {err}") from None
    missing = [n for n in _names() if n not in out]
    if missing:
        raise DataError(f"{path}: the archive lacks {', '.join(missing)}")
    return out
