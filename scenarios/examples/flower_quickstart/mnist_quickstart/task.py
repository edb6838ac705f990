"""mnist_quickstart: A Flower / PyTorch app on MNIST."""

import gzip
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz'), for 28x28 grey images"""

    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


# MNIST is read from its IDX archives with gzip + numpy: neither torchvision nor
# flwr-datasets is available where dtemu runs.
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
MEAN, STD = 0.1307, 0.3081
PARTITION_SEED = 0


def data_folder(data_root: str) -> Path:
    """The folder holding MNIST/raw/: data-root, else $DTEMU_DATA, else ~/.cache/dtemu."""
    root = data_root or os.environ.get("DTEMU_DATA") or Path.home() / ".cache" / "dtemu"
    return Path(root) / "MNIST" / "raw"


def read_idx(path: Path) -> np.ndarray:
    """A gzipped IDX file of uint8 (labels: 1-D, images: 3-D)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


# Cached per process: a runtime that hosts many clients in one process decodes once.
@lru_cache(maxsize=None)
def mnist(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 28, 28), labels (N,)) of one split, as uint8."""
    images, labels = FILES[split]
    return read_idx(folder / images), read_idx(folder / labels)


@lru_cache(maxsize=None)
def permutation(n: int) -> np.ndarray:
    return np.random.default_rng(PARTITION_SEED).permutation(n)


def to_tensors(images: np.ndarray, labels: np.ndarray):
    x = (images.astype(np.float32) / 255.0 - MEAN) / STD
    return torch.from_numpy(x[:, None]), torch.from_numpy(labels.astype(np.int64))


def load_data(
    partition_id: int,
    num_partitions: int,
    samples_per_client: int = 0,
    test_samples: int = 500,
    data_root: str = "",
):
    """Load an IID partition of MNIST's training set and the first test samples.

    The partition is part `partition_id` of `num_partitions` contiguous parts of a
    seeded permutation of the 60,000 training samples, cut to its first
    `samples_per_client` (0: the whole part). Returns (x_train, y_train, x_test, y_test).
    """
    folder = data_folder(data_root)
    images, labels = mnist(folder, "train")
    part = np.array_split(permutation(len(labels)), num_partitions)[partition_id]
    if samples_per_client > 0:
        part = part[:samples_per_client]
    test_images, test_labels = mnist(folder, "test")
    return (
        *to_tensors(images[part], labels[part]),
        *to_tensors(test_images[:test_samples], test_labels[:test_samples]),
    )


def train(net, x, y, epochs, lr, batch_size, seed):
    """Train the model on (x, y); the shuffle is drawn from `seed` alone."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    net.train()
    running_loss, batches = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            batches += 1
    return running_loss / max(batches, 1)


def test(net, x, y, batch_size=1000):
    """Validate the model on (x, y): (mean loss per sample, accuracy)."""
    net.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(x), batch_size):
            outputs = net(x[start : start + batch_size])
            labels = y[start : start + batch_size]
            loss += F.cross_entropy(outputs, labels, reduction="sum").item()
            correct += (outputs.argmax(1) == labels).sum().item()
    return loss / len(x), correct / len(x)
