"""Models nobody here wrote: torchvision's classifiers, and the classic on-device nets as their
papers give them, for the real-model fidelity suite (benchmarks/fidelity.py,
tests/test_real_models.py).

torchvision's wheel for torch 2.13.0 is a CUDA build whose C extension (detection ops such as
nms) does not load beside the CPU torch, and `import torchvision` fails registering fake
kernels for those ops. The model definitions are plain Python and need none of it: `models()`
imports torchvision with its two registration modules stubbed out, and nothing else changes.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn


def torchvision_models():
    """`torchvision.models`, imported without its C extension's op registrations."""
    for name in ("_meta_registrations", "_autograd_registrations"):
        sys.modules.setdefault(f"torchvision.{name}", types.ModuleType(f"torchvision.{name}"))
    import torchvision.models

    return torchvision.models


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


@dataclass(frozen=True)
class RealModel:
    name: str
    make: Callable[[], nn.Module]
    input_shape: tuple[int, ...]  # one sample
    classes: int
    batches: tuple[int, ...] = (1, 4, 8)
    notes: str = ""
    optimizer: dict = field(default_factory=lambda: dict(lr=0.05, momentum=0.9))


def _tv(name, **kw):
    def make():
        return getattr(torchvision_models(), name)(num_classes=10, **kw)
    return make


def _vit(**kw):
    def make():
        return torchvision_models().vision_transformer.VisionTransformer(num_classes=10, **kw)
    return make


# Dropout is 0 in the torchvision classifiers: PyTorch's masks are not the C runtime's
# (Dropout itself is checked with the C's own masks by the fuzzer and the op tests).
REAL_MODELS = [
    RealModel("lenet5", LeNet5, (1, 32, 32), 10),
    RealModel("ds_cnn_kws", DSCNN, (1, 49, 10), 12),
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
]


def real_model(name: str) -> RealModel:
    for m in REAL_MODELS:
        if m.name == name:
            return m
    raise KeyError(f"no real model {name!r}; known: {', '.join(m.name for m in REAL_MODELS)}")


def batches(model: RealModel, batch: int, steps: int = 3, seed: int = 0, sample=None):
    """`steps` batches of random inputs (one sample shaped `sample`, by default the model's)
    and labels."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn((batch, *(sample or model.input_shape)), generator=gen),
             torch.randint(0, model.classes, (batch,), generator=gen)) for _ in range(steps)]
