"""Built-in tasks that read data from this machine (core.ml.task names them: ``task: cifar10_resnet18``)."""

from __future__ import annotations

from dtemu.core.ml.resnet import ResNet18
from dtemu.host.cifar import load_cifar10


class Cifar10ResNet18:
    """CIFAR-10 with ResNet-18, the DGC and GeoMX papers' workload: cross-entropy, top-1 accuracy."""

    train_s_per_sample = 4.6e-2  # batch 32, 1 thread, AMD EPYC (python -m tools.bench_tasks --synthetic)

    def model(self):
        return ResNet18()

    def data(self):
        return load_cifar10()
