"""host.datasets (archives, IDX files, loading) and core.ml.data (parsing, partitioners, round subsets)."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dtemu.core.ml.data import (
    Dataset,
    partition,
    partition_dirichlet,
    partition_iid,
    partition_shards,
    round_subset,
)
from dtemu.host import datasets as data
from dtemu.host.datasets import ensure_archives, load_dataset, load_dataset_factory, read_idx, resolve_root
from dtemu.core.errors import DataError, ScenarioError
from helpers import DATA, needs_mnist

ARCHIVES = tuple(data.SOURCES["mnist"].md5)


REAL_ROOT = Path(DATA)
needs_real = needs_mnist


def _idx_gz(path: Path, magic: int, dims: tuple[int, ...], payload: bytes) -> Path:
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims)
    path.write_bytes(gzip.compress(header + payload))
    return path


# --- resolve_root --------------------------------------------------------------


def test_resolve_root_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("DTEMU_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_root(str(tmp_path / "scen")) == tmp_path / "scen"
    assert resolve_root(None) == tmp_path / "env"
    monkeypatch.delenv("DTEMU_DATA")
    assert resolve_root(None) == tmp_path / "xdg" / "dtemu"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_root(None) == tmp_path / "home" / ".cache" / "dtemu"


# --- read_idx ------------------------------------------------------------------


def test_read_idx_small_files(tmp_path):
    labels = _idx_gz(tmp_path / "l.gz", 0x801, (3,), bytes([1, 2, 9]))
    images = _idx_gz(tmp_path / "i.gz", 0x803, (2, 2, 3), bytes(range(12)))
    assert read_idx(labels).tolist() == [1, 2, 9]
    img = read_idx(images)
    assert img.shape == (2, 2, 3) and img.dtype == np.uint8 and img[1, 1, 2] == 11


@pytest.mark.parametrize("case", ["truncated", "too_long", "bad_magic", "not_gzip",
                                  "cut_gzip", "short_header", "empty"])
def test_read_idx_bad_files_raise_data_error(tmp_path, case):
    p = tmp_path / "bad.gz"
    if case == "truncated":
        _idx_gz(p, 0x803, (2, 2, 3), bytes(11))
    elif case == "too_long":
        _idx_gz(p, 0x801, (3,), bytes(4))
    elif case == "bad_magic":
        _idx_gz(p, 0x802, (3,), bytes(3))
    elif case == "not_gzip":
        p.write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x05")
    elif case == "cut_gzip":
        blob = gzip.compress(struct.pack(">II", 0x801, 1000) + bytes(1000))
        p.write_bytes(blob[: len(blob) // 2])
    elif case == "short_header":
        p.write_bytes(gzip.compress(struct.pack(">I", 0x803) + b"\x00\x00"))
    elif case == "empty":
        p.write_bytes(gzip.compress(b""))
    with pytest.raises(DataError, match="bad.gz"):
        read_idx(p)


def test_read_idx_missing_file(tmp_path):
    with pytest.raises(DataError):
        read_idx(tmp_path / "nope.gz")


@needs_real
def test_read_idx_real_mnist():
    raw = REAL_ROOT / "MNIST" / "raw"
    y = read_idx(raw / "train-labels-idx1-ubyte.gz")
    assert y.shape == (60000,) and y.min() == 0 and y.max() == 9
    assert read_idx(raw / "t10k-images-idx3-ubyte.gz").shape == (10000, 28, 28)


# --- ensure_archives -----------------------------------------------------------


@needs_real
def test_ensure_archives_present_never_fetches():
    def no_fetch(url):
        raise AssertionError(f"fetched {url}")

    assert ensure_archives(REAL_ROOT, "mnist", fetch=no_fetch) == REAL_ROOT / "MNIST" / "raw"


@needs_real
def test_ensure_archives_downloads_and_checks_md5(tmp_path):
    good = {f: (REAL_ROOT / "MNIST" / "raw" / f).read_bytes() for f in ARCHIVES}
    urls = []

    def fetch(url):
        urls.append(url)
        return good[url.rsplit("/", 1)[1]]

    folder = ensure_archives(tmp_path, "mnist", fetch=fetch)
    assert sorted(p.name for p in folder.iterdir()) == sorted(ARCHIVES)  # no temp files
    for f in ARCHIVES:
        assert (folder / f).read_bytes() == good[f]
    assert all(u.startswith(data.SOURCES["mnist"].mirrors[0]) for u in urls)


def test_ensure_archives_bad_bytes_leave_nothing(tmp_path):
    urls = []

    def fetch(url):
        urls.append(url)
        return b"<html>not found</html>"

    with pytest.raises(DataError, match="MD5"):
        ensure_archives(tmp_path, "fashion_mnist", fetch=fetch)
    raw = tmp_path / "FashionMNIST" / "raw"
    assert not raw.exists() or list(raw.iterdir()) == []
    assert urls  # every mirror was tried


def test_ensure_archives_falls_back_to_next_mirror(tmp_path, monkeypatch):
    blob = b"pretend archive"
    src = data.SOURCES["mnist"]
    fake = data._Source(src.folder, ("http://down/", "http://up/"),
                        {"f.gz": hashlib.md5(blob).hexdigest()}, src.mean, src.std)
    monkeypatch.setitem(data.SOURCES, "fake", fake)

    def fetch(url):
        if url.startswith("http://down/"):
            raise OSError("connection refused")
        return blob

    folder = ensure_archives(tmp_path, "fake", fetch=fetch)
    assert (folder / "f.gz").read_bytes() == blob


def test_ensure_archives_present_but_corrupt(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in ARCHIVES:
        (raw / f).write_bytes(b"corrupt")
    with pytest.raises(DataError, match="MD5"):
        ensure_archives(tmp_path, "mnist", fetch=lambda url: b"")
    assert (raw / ARCHIVES[0]).read_bytes() == b"corrupt"  # not rewritten


def test_unknown_dataset(tmp_path):
    with pytest.raises(DataError, match="fashion_mnist"):
        ensure_archives(tmp_path, "cifar10")


# --- load_dataset --------------------------------------------------------------


@needs_real
def test_load_mnist():
    ds = load_dataset("mnist", REAL_ROOT)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_train.dtype == torch.float32
    assert ds.x_test.shape == (10000, 1, 28, 28)
    assert ds.y_train.dtype == torch.int64 and ds.y_train.shape == (60000,)
    assert int(ds.y_test.min()) == 0 and int(ds.y_test.max()) == 9
    # normalised with the training set's own mean and std
    assert abs(float(ds.x_train.mean())) < 1e-3
    assert abs(float(ds.x_train.std()) - 1.0) < 1e-3
    assert load_dataset("mnist", str(REAL_ROOT)) is ds  # shared in-process


def _toy_data():
    rng = np.random.default_rng(0)
    return (rng.random((20, 8, 8)), rng.integers(0, 3, 20),
            torch.zeros(5, 1, 8, 8), np.arange(5) % 3)


def _not_a_dataset():
    return [1, 2, 3]


def test_load_dataset_factory():
    ds = load_dataset_factory(f"{__name__}:_toy_data")
    assert isinstance(ds, Dataset)
    assert ds.x_train.shape == (20, 1, 8, 8) and ds.x_train.dtype == torch.float32
    assert ds.y_test.dtype == torch.int64 and ds.y_test.tolist() == [0, 1, 2, 0, 1]
    with pytest.raises(DataError, match="4-tuple"):
        load_dataset_factory(f"{__name__}:_not_a_dataset")
    # the code it names failing is the scenario's error, at its key (the CLIs exit 2)
    with pytest.raises(ScenarioError, match="data.factory: .*cannot be imported"):
        load_dataset_factory(f"{__name__}:nope")
    with pytest.raises(ScenarioError, match="package.module:factory"):
        load_dataset_factory("no_colon")
    with pytest.raises(ScenarioError, match="data.factory: .*SystemExit"):
        load_dataset_factory("sys:exit")


# --- partitioners --------------------------------------------------------------

LABELS = np.repeat(np.arange(10), 100)[np.random.default_rng(1).permutation(1000)]


def _assert_exact_cover(parts, n):
    allidx = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts)
    assert len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 500), clients=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_partition_iid(n, clients, seed):
    if clients > n:
        with pytest.raises(DataError):
            partition_iid(n, clients, seed)
        return
    parts = partition_iid(n, clients, seed)
    _assert_exact_cover(parts, n)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_iid(n, clients, seed)))


@pytest.mark.parametrize("clients,spc", [(10, 2), (7, 2), (50, 2), (5, 3)])
def test_partition_shards(clients, spc):
    parts = partition_shards(LABELS, clients, seed=3, shards_per_client=spc)
    assert len(parts) == clients
    _assert_exact_cover(parts, len(LABELS))
    assert all(len(np.unique(LABELS[p])) <= 2 * spc for p in parts)
    again = partition_shards(LABELS, clients, seed=3, shards_per_client=spc)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_partition_shards_is_skewed():
    # 100 shards of 10 labels sorted by class: every shard holds one class.
    parts = partition_shards(LABELS, 50, seed=0, shards_per_client=2)
    assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)


@settings(max_examples=30, deadline=None)
@given(clients=st.integers(1, 100), seed=st.integers(0, 2**32 - 1),
       alpha=st.sampled_from([0.01, 0.1, 0.5, 1.0, 100.0]))
def test_partition_dirichlet(clients, seed, alpha):
    parts = partition_dirichlet(LABELS, clients, seed, alpha)
    assert len(parts) == clients
    _assert_exact_cover(parts, len(LABELS))
    assert min(len(p) for p in parts) >= 1
    again = partition_dirichlet(LABELS, clients, seed, alpha)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_partition_dirichlet_alpha_controls_skew():
    def mean_classes(alpha):
        parts = partition_dirichlet(LABELS, 10, 0, alpha)
        return np.mean([len(np.unique(LABELS[p])) for p in parts])

    assert mean_classes(0.05) < mean_classes(100.0) == 10


def test_partition_dispatcher():
    y = torch.from_numpy(LABELS)
    for kind in ("iid", "shards", "dirichlet"):
        _assert_exact_cover(partition(kind, y, 10, seed=0), len(LABELS))
    assert all(np.array_equal(a, b) for a, b in
               zip(partition("dirichlet", LABELS, 10, 4, alpha=0.3),
                   partition_dirichlet(LABELS, 10, 4, 0.3)))
    with pytest.raises(ValueError, match="iid"):
        partition("zipf", LABELS, 10, 0)
    with pytest.raises(ValueError):
        partition_dirichlet(LABELS, 10, 0, alpha=0.0)


# --- round_subset --------------------------------------------------------------


def test_round_subset():
    idx = np.arange(100, 200, dtype=np.int64)
    a = round_subset(idx, 30, seed=1, round_=2, client=3)
    assert len(a) == 30 and len(np.unique(a)) == 30 and np.isin(a, idx).all()
    assert a.dtype == np.int64
    assert np.array_equal(a, round_subset(idx, 30, seed=1, round_=2, client=3))
    assert not np.array_equal(a, round_subset(idx, 30, seed=1, round_=3, client=3))
    assert not np.array_equal(a, round_subset(idx, 30, seed=1, round_=2, client=4))
    for subset in (None, 100, 1000):
        full = round_subset(idx, subset, seed=1, round_=2, client=3)
        assert np.array_equal(np.sort(full), idx) and not np.array_equal(full, idx)
    with pytest.raises(ValueError):
        round_subset(idx, 0, seed=1, round_=2, client=3)
