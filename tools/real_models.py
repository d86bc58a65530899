"""Models nobody here wrote: torchvision's classifiers, and the classic on-device nets as their
papers give them, for the real-model fidelity suite (benchmarks/fidelity.py,
tests/test_real_models.py, benchmarks/real_models.py). Each says how to make its input
(`make_input`): float samples, or token ids for a text model.

torchvision's wheel for torch 2.13.0 is a CUDA build whose C extension (detection ops such as
nms) does not load beside the CPU torch, and `import torchvision` fails registering fake
kernels for those ops. The model definitions are plain Python and need none of it:
`torchvision_models()` and `torchvision_ops()` import torchvision with its two registration
modules stubbed out, and nothing else changes.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn


def _without_op_registrations():
    for name in ("_meta_registrations", "_autograd_registrations"):
        sys.modules.setdefault(f"torchvision.{name}", types.ModuleType(f"torchvision.{name}"))


def torchvision_models():
    """`torchvision.models`, imported without its C extension's op registrations."""
    _without_op_registrations()
    import torchvision.models

    return torchvision.models


def torchvision_ops():
    """`torchvision.ops` the same way: its plain-Python layers (StochasticDepth,
    stochastic_depth, SqueezeExcitation) work; the detection ops (nms, roi_align) need the
    C extension and do not."""
    _without_op_registrations()
    import torchvision.ops

    return torchvision.ops


class LeNet5(nn.Module):
    """LeCun et al. 1998: tanh and average pooling (subsampling), 1x32x32 in."""

    def __init__(self, classes=10):
        super().__init__()
        self.c1, self.c3 = nn.Conv2d(1, 6, 5), nn.Conv2d(6, 16, 5)
        self.f5, self.f6, self.out = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, classes)

    def forward(self, x):
        x = nn.functional.avg_pool2d(torch.tanh(self.c1(x)), 2)
        x = nn.functional.avg_pool2d(torch.tanh(self.c3(x)), 2)
        x = torch.tanh(self.f6(torch.tanh(self.f5(x.flatten(1)))))
        return self.out(x)


class DSCNN(nn.Module):
    """Keyword spotting, Zhang et al. 2017 ("Hello Edge") DS-CNN-S: 49x10 MFCC in, a strided
    conv and four depthwise-separable blocks (each conv followed by BatchNorm and ReLU),
    global average pooling, 12 keywords."""

    def __init__(self, classes=12, width=64):
        super().__init__()
        layers = [nn.Conv2d(1, width, (10, 4), stride=2, padding=(5, 1)), nn.BatchNorm2d(width),
                  nn.ReLU()]
        for _ in range(4):
            layers += [nn.Conv2d(width, width, 3, padding=1, groups=width), nn.BatchNorm2d(width),
                       nn.ReLU(), nn.Conv2d(width, width, 1), nn.BatchNorm2d(width), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        return self.fc(nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class BasicLSTMKWS(nn.Module):
    """Keyword spotting, Zhang et al. 2017 ("Hello Edge") Basic LSTM-S: one LSTM layer of 118
    cells (no projection, no peepholes) over 49 frames of 10 MFCC (40 ms windows, 20 ms
    stride), its last hidden state to 12 keywords (ARM's ML-KWS-for-MCU
    `create_basic_lstm_model`, model_size_info 118). Input [N, 49, 10]."""

    def __init__(self, classes=12, cells=118, features=10):
        super().__init__()
        self.lstm = nn.LSTM(features, cells, batch_first=True)
        self.fc = nn.Linear(cells, classes)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.fc(h[-1])


class GRUKWS(nn.Module):
    """Keyword spotting, Zhang et al. 2017 ("Hello Edge") GRU-S: one GRU layer of 154 cells,
    its last hidden state to 12 keywords (ML-KWS-for-MCU `create_gru_model`, model_size_info
    1 154). The paper's GRU-S reads 25 frames (40 ms stride); this one reads the 49 frames
    x 10 MFCC of the other keyword-spotting nets (20 ms stride, as its GRU-M and GRU-L).
    Input [N, 49, 10]."""

    def __init__(self, classes=12, cells=154, features=10, layers=1):
        super().__init__()
        self.gru = nn.GRU(features, cells, num_layers=layers, batch_first=True)
        self.fc = nn.Linear(cells, classes)

    def forward(self, x):
        _, h = self.gru(x)
        return self.fc(h[-1])


class HARCNN(nn.Module):
    """Human activity recognition from a phone's inertial sensors: UCI-HAR (Anguita et al.
    2013: 9 signals, body and total acceleration and angular velocity on three axes, in
    windows of 128 samples, 2.56 s at 50 Hz; 6 activities), by a 1-D convnet in the manner
    of Ronao & Cho 2016 (Expert Systems with Applications 59): Conv1d-ReLU-MaxPool1d blocks
    with kernels of 9 and pooling of 3, then a hidden layer. Widths 32-64-64 and 100 hidden
    units here, smaller than theirs, for a microcontroller."""

    def __init__(self, classes=6, channels=9, widths=(32, 64, 64), hidden=100):
        super().__init__()
        layers, length = [], 128
        for width in widths:
            layers += [nn.Conv1d(channels, width, 9, padding=4), nn.ReLU(), nn.MaxPool1d(3)]
            channels, length = width, length // 3
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(channels * length, hidden), nn.ReLU(),
                                        nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class BagOfEmbeddings(nn.Module):
    """Text classification as fastText does it (Joulin et al. 2017, "Bag of Tricks for
    Efficient Text Classification"): the mean of the tokens' embeddings, then one linear
    layer. 4 classes as AG News; token ids in, a vocabulary of 1000 here."""

    def __init__(self, classes=4, vocab=1000, dim=32):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.fc = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.fc(self.embedding(ids).mean(1))


def normal_samples(shape, gen: torch.Generator) -> torch.Tensor:
    """Float inputs: standard normal values."""
    return torch.randn(shape, generator=gen)


def token_ids(vocab: int):
    """Integer inputs: token ids drawn uniformly from [0, vocab)."""
    def make(shape, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, vocab, shape, generator=gen)
    return make


@dataclass(frozen=True)
class RealModel:
    name: str
    make: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # one sample
    classes: int
    batches: tuple[int, ...] = (1, 4, 8)
    notes: str = ""
    optimizer: dict = field(default_factory=lambda: dict(lr=0.05, momentum=0.9))
    # (shape with the batch first, generator) -> the model's input of that shape
    make_input: Callable[[tuple, torch.Generator], torch.Tensor] = normal_samples

    def example_input(self, batch: int, gen: torch.Generator | None = None, sample=None):
        """One batch of inputs (one sample shaped `sample`, by default the model's)."""
        gen = gen or torch.Generator().manual_seed(0)
        return self.make_input((batch, *(sample or self.input_shape)), gen)


def _tv(name, **kw):
    def make():
        return getattr(torchvision_models(), name)(num_classes=10, **kw)
    return make


def _vit(**kw):
    def make():
        return torchvision_models().vision_transformer.VisionTransformer(num_classes=10, **kw)
    return make


# Dropout is 0 in the first torchvision classifiers (as the README's figures were measured);
# efficientnet_b0 keeps its Dropout (in place) and StochasticDepth: the referee applies the
# C runtime's masks to PyTorch (fidelity/dropout.py).
REAL_MODELS = [
    RealModel("lenet5", LeNet5, (1, 32, 32), 10),
    RealModel("ds_cnn_kws", DSCNN, (1, 49, 10), 12),
    RealModel("gru_kws", GRUKWS, (49, 10), 12, notes="49 frames, not GRU-S's 25"),
    RealModel("basic_lstm_kws", BasicLSTMKWS, (49, 10), 12),
    RealModel("mobilenet_v2", _tv("mobilenet_v2", width_mult=0.35, dropout=0.0), (3, 64, 64),
              10, notes="width 0.35"),
    RealModel("resnet18", _tv("resnet18"), (3, 64, 64), 10),
    RealModel("squeezenet1_1", _tv("squeezenet1_1", dropout=0.0), (3, 64, 64), 10),
    RealModel("googlenet", _tv("googlenet", aux_logits=False, dropout=0.0, init_weights=True),
              (3, 64, 64), 10, notes="no auxiliary heads"),
    RealModel("regnet_x_400mf", _tv("regnet_x_400mf"), (3, 64, 64), 10),
    RealModel("mnasnet0_5", _tv("mnasnet0_5", dropout=0.0), (3, 64, 64), 10),
    RealModel("mobilenet_v3_small", _tv("mobilenet_v3_small", dropout=0.0), (3, 64, 64), 10),
    RealModel("shufflenet_v2_x0_5", _tv("shufflenet_v2_x0_5"), (3, 64, 64), 10),
    # torchvision's ViT class at a microcontroller's size: 4x4 patches of a 32x32 image by a
    # strided conv, a class token and position embedding, 2 pre-norm encoder blocks
    # (LayerNorm, 4-head nn.MultiheadAttention of width 64, LayerNorm, GELU MLP of 128),
    # the head on the class token. Its head starts at zero, as torchvision initialises it:
    # the first step trains only the head.
    RealModel("vit_tiny", _vit(image_size=32, patch_size=4, num_layers=2, num_heads=4,
                               hidden_dim=64, mlp_dim=128), (3, 32, 32), 10,
              notes="2 layers, width 64, 4 heads, 4x4 patches"),
    RealModel("efficientnet_b0", _tv("efficientnet_b0"), (3, 64, 64), 10,
              notes="Dropout 0.2 in place, stochastic depth 0.2"),
    RealModel("har_cnn", HARCNN, (9, 128), 6),
    RealModel("fasttext_bag", BagOfEmbeddings, (32,), 4, make_input=token_ids(1000),
              notes="32 token ids in"),
]


def real_model(name: str) -> RealModel:
    for m in REAL_MODELS:
        if m.name == name:
            return m
    raise KeyError(f"no real model {name!r}; known: {', '.join(m.name for m in REAL_MODELS)}")


def batches(model: RealModel, batch: int, steps: int = 3, seed: int = 0, sample=None):
    """`steps` batches of random inputs (the model's `make_input`; one sample shaped
    `sample`, by default the model's) and labels."""
    gen = torch.Generator().manual_seed(seed)
    return [(model.example_input(batch, gen, sample),
             torch.randint(0, model.classes, (batch,), generator=gen)) for _ in range(steps)]
