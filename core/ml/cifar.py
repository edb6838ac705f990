"""CIFAR-10 from the bytes of its binary version (``cifar-10-binary.tar.gz``): pure parsing.

Each batch file is 10,000 records of 3,073 bytes: a label byte (0-9), then a
32x32 image as 1,024 red, 1,024 green and 1,024 blue bytes, row by row.  Five
training files (``data_batch_1.bin`` .. ``_5``) and one test file
(``test_batch.bin``).  The binary version needs no unpickling: every byte is
data, checked here.  Finding, fetching and checking the archive is the host's
(host/cifar.py).
"""

from __future__ import annotations

import numpy as np
import torch

from dtemu.core.errors import DataError

RECORD = 1 + 3 * 32 * 32
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILE = "test_batch.bin"
FOLDER = "cifar-10-batches-bin"  # the archive's one folder
# per channel, of the training images scaled to [0, 1]
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def parse_batch(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 3, 32, 32), labels uint8 (N,)) of one batch file's bytes, checked."""
    if not data or len(data) % RECORD:
        raise DataError(f"{where}: {len(data)} bytes is not a whole number of {RECORD}-byte records")
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD)
    labels = records[:, 0].copy()
    if labels.max() > 9:
        raise DataError(f"{where}: label {labels.max()} out of range 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), labels


def to_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised float32 images and int64 labels (torchvision's ToTensor + Normalize(MEAN, STD))."""
    x = torch.from_numpy(images).to(torch.float32).div_(255.0)
    mean = torch.tensor(MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float32).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std), torch.from_numpy(labels.astype(np.int64))


def encode_batch(images: np.ndarray, labels: np.ndarray) -> bytes:
    """The inverse of ``parse_batch``: what a synthetic archive for tests holds."""
    images = np.asarray(images, dtype=np.uint8).reshape(len(labels), -1)
    return np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], images], axis=1).tobytes()
