"""Where the error-feedback residuals beyond ``fl.residuals_in_memory`` go (core.fl.residuals):
one ``.npy`` file per client in a folder of the run, read back (and removed) when it trains."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path

import numpy as np


class DiskSpill(MutableMapping):
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._names: set[str] = set()

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.npy"  # node names are safe file names (client<N>)

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        np.save(self._path(key), value, allow_pickle=False)
        self._names.add(key)

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._names:
            raise KeyError(key)
        return np.load(self._path(key), allow_pickle=False)

    def __delitem__(self, key: str) -> None:
        if key not in self._names:
            raise KeyError(key)
        self._names.discard(key)
        self._path(key).unlink(missing_ok=True)

    def __contains__(self, key) -> bool:
        return key in self._names

    def __iter__(self):
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)
