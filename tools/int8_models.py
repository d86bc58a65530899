"""The int8 (NITI) test models: small chains and DAGs with biases, residual adds, a depthwise
conv, concat, average pooling and folded BatchNorms, what the int8 path must train. The
tests (test_niti_graph.py, test_int8_graph.py) and the int8 mutants' benchmark
(benchmarks/mutants.py --precision int8) train them on `int8_batches`."""

from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.body = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.body(h) + h)
        return self.head(torch.flatten(nn.functional.max_pool2d(h, 2), 1))


class DepthwiseAveraging(nn.Module):
    """A depthwise conv in a residual block, a grouped conv whose output is concatenated
    with its input, average pooling over windows that leave a column out, and a global
    average: the MobileNet- and DenseNet-style ops."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.grouped = nn.Conv2d(8, 8, 1, groups=2, bias=False)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.dw(h)) + h
        h = torch.cat([torch.relu(self.grouped(h)), h], 1)
        h = nn.functional.avg_pool2d(h, (2, 3))
        return self.head(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


class OrdinaryCNN(nn.Module):
    """Biases, BatchNorm (with running statistics a pretrained net would have), a depthwise
    conv, a residual add and ReLU6: what the int8 path must train. Each BatchNorm is folded into
    its conv (training/batch_norm_folding.py) before the integer step is derived."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8),
                                nn.ReLU())
        self.pw = nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16),
                                nn.ReLU6())
        self.head = nn.Linear(16, 10)
        gen = torch.Generator().manual_seed(2)
        for bn in (self.stem[1], self.dw[1], self.pw[1]):
            c = bn.num_features
            bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            bn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.weight.data.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)

    def forward(self, x):
        h = self.stem(x)
        h = self.dw(h) + h
        h = nn.functional.max_pool2d(self.pw(h), 2)
        return self.head(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


class TableActivations(nn.Module):
    """Every function the int8 step computes by table (niti/tables.py), each after a conv or
    linear: MobileNetV3's Hardswish and Hardsigmoid, EfficientNet's SiLU, Sigmoid, Tanh, and
    GELU in both of PyTorch's forms."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 8, 1)
        self.down = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 16)
        self.gate = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        f = nn.functional
        h = f.hardswish(self.stem(x))
        h = f.silu(self.dw(h))
        h = torch.sigmoid(self.pw(h))
        h = torch.tanh(self.down(h))
        h = f.gelu(self.fc(h.flatten(1)), approximate="tanh")
        h = f.hardsigmoid(self.gate(f.gelu(h)))
        return self.head(h)


def chain(bias: bool):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=bias), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64, 10, bias=bias))


MODELS = [lambda: chain(False), lambda: chain(True), Residual, DepthwiseAveraging, OrdinaryCNN]
MODEL_IDS = ["chain", "chain_with_biases", "residual_with_biases", "depthwise_averaging",
             "batch_norm_depthwise_residual"]


def int8_batches(steps: int = 4):
    """`steps` batches of 4 samples of 1x8x8, 10 classes (the int8 tests' data)."""
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 1, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))
            for _ in range(steps)]
