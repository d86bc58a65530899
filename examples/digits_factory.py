"""A model factory for the command line:

    ubitrain compile examples/digits_factory.py:factory --out-dir build/digits
    ubitrain compile examples/digits_factory.py:factory --batch 16 --optimizer adam --lr 1e-3

`factory(batch)` returns (module, example_inputs, labels): the network, one batch of inputs
and one batch of labels from scikit-learn's digits. Their shapes and dtypes fix the compiled
training step: float32 [batch, 1, 8, 8] images, int64 [batch] class indices.
"""

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn


def factory(batch: int = 32):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10),
    )
    digits = load_digits()
    x = (digits.images[:batch].astype(np.float32) / 16.0)[:, None]
    y = digits.target[:batch].astype(np.int64)
    return model, (torch.from_numpy(x),), torch.from_numpy(y)
