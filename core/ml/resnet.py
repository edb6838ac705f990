"""ResNet-18 for 32x32 images (He et al. 2016, as the DGC and GeoMX papers train it on CIFAR-10).

The CIFAR variant: a 3x3 stem of 64 channels without max-pooling, four stages
of two basic blocks (64, 128, 256, 512 channels; stride 2 from the second on),
global average pooling and one linear layer: 11,173,962 parameters for 10
classes.  Batch normalisation's running statistics (9,600 more floats) are
floating state, so they travel with the weights (core.ml.params: 11,183,562 in
all) and are averaged with them.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:  # the projection shortcut where the shape changes
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 10, channels: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        stages, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        out = self.stages(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))
