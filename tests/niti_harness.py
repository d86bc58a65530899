"""What the precision="int8" (NITI) tests share: a small integer-only CNN, its batches, and the
check of a build against NITI's numpy reference (ubitrain.fidelity.niti_check), bit for bit."""

import numpy as np
import torch
from torch import nn

from ubitrain.fidelity.niti_check import compare_with_reference


def niti_net(seed: int = 0):
    """Two bias-free convs with ReLU, a max pool and a bias-free Linear: 8x8 in, 5 classes."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.ReLU(),
                         nn.Flatten(), nn.Linear(32, 5, bias=False))


def niti_batches(n: int, batch: int = 4, seed: int = 0):
    """`n` batches of (float32 images [batch, 1, 8, 8], int64 labels in [0, 5)), as numpy."""
    g = np.random.default_rng(seed)
    return [(g.standard_normal((batch, 1, 8, 8)).astype(np.float32), g.integers(0, 5, batch))
            for _ in range(n)]


def check_against_reference(pkg, model, data, config):
    """Train the build of `model` beside NITI's numpy reference (fidelity/niti_check.py): every
    integer parameter after every step, the loss within rounding and predict's logits after
    the last step, bit for bit. Returns the C's rescale statistics."""
    with pkg.build() as trainer:
        run = compare_with_reference(trainer, model, data, config)
        stats = trainer.rescale_stats()
    assert run.differences == []
    assert run.moved > 0, "no parameter changed: the check would pass without training"
    return stats
