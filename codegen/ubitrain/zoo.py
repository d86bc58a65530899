"""Reference models in plain torch.nn: the test suite's and the benchmarks' zoo.

Each entry gives a model factory and the shape of one input sample, so that tests and
benchmarks can build any batch size. Only ops from the README's table are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


class LeNet5(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, classes),
        )

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project, residual when it fits."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_residual = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_residual else y


class MobileNetV2Small(nn.Module):
    """Stem, three inverted residual blocks (one strided, one with a residual add), head.

    Three blocks, not five: deeper stacks of BatchNorm over a batch of four make training
    chaotic (PyTorch's own losses move by 1e-3 within ten steps from weights 1e-7 apart),
    and then no float32 implementation can be compared with another at 1e-4.
    """

    def __init__(self, classes: int = 10, width: int = 8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU6())
        self.blocks = nn.Sequential(
            InvertedResidual(width, width, 1, 1),
            InvertedResidual(width, 2 * width, 2, 4),
            InvertedResidual(2 * width, 2 * width, 1, 4),
        )
        self.head = nn.Sequential(nn.Conv2d(2 * width, 8 * width, 1, bias=False),
                                  nn.BatchNorm2d(8 * width), nn.ReLU6())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(8 * width, classes)

    def forward(self, x):
        y = self.pool(self.head(self.blocks(self.stem(x))))
        return self.classifier(torch.flatten(y, 1))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:  # the strided 1x1 shortcut
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + self.shortcut(x))


class ResNetSmall(nn.Module):
    def __init__(self, classes: int = 10, width: int = 8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.layer1 = BasicBlock(width, width, 1)
        self.layer2 = BasicBlock(width, 2 * width, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        y = self.pool(self.layer2(self.layer1(self.stem(x))))
        return self.fc(torch.flatten(y, 1))


class MLPLayerNormGELU(nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, hidden), nn.LayerNorm(hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.GELU(approximate="tanh"),
            nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)


class DigitsCNN(nn.Module):
    """The demo's model: conv-BN-ReLU-pool, conv-ReLU, linear on 8x8 grey digits."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
        )
        self.classifier = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class DigitsCNNNiti(nn.Module):
    """The demo's CNN the way NITI trains it in int8: no BatchNorm and no biases."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.ReLU(),
        )
        self.classifier = nn.Linear(16 * 4 * 4, classes, bias=False)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class DigitsResidualCNN(nn.Module):
    """An ordinary small CNN on 8x8 digits, what int8 training must handle: biases,
    BatchNorm, a depthwise conv in a residual block and a pointwise conv."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.depthwise = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8),
                                       nn.BatchNorm2d(8), nn.ReLU())
        self.pointwise = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 1),
                                       nn.BatchNorm2d(16), nn.ReLU())
        self.classifier = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        h = self.stem(x)
        h = self.depthwise(h) + h
        return self.classifier(torch.flatten(self.pointwise(h), 1))


@dataclass(frozen=True)
class ZooEntry:
    factory: Callable[[], nn.Module]
    sample_shape: tuple[int, ...]
    classes: int = 10


ZOO = {
    "lenet5": ZooEntry(LeNet5, (1, 32, 32)),
    "mobilenetv2_small": ZooEntry(MobileNetV2Small, (3, 32, 32)),
    "resnet_small": ZooEntry(ResNetSmall, (3, 16, 16)),
    "mlp_layernorm_gelu": ZooEntry(MLPLayerNormGELU, (32,)),
    "digits_cnn": ZooEntry(DigitsCNN, (1, 8, 8)),
    "digits_cnn_niti": ZooEntry(DigitsCNNNiti, (1, 8, 8)),
}
