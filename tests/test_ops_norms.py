"""BatchNorm, LayerNorm and GroupNorm in training mode, and weight normalization: the
generated C against PyTorch.

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from op_harness import check, randn, seeded
from torch import nn


@pytest.mark.parametrize("affine,momentum,offset,spread", [
    (True, 0.1, 1.0, 2.0),
    (False, 0.3, 1.0, 2.0),
    (True, 0.1, 50.0, 0.05),  # a mean far above the spread: the variance gradient cancels
], ids=["affine", "no_affine", "large_mean"])
def test_batch_norm2d_training(affine, momentum, offset, spread, tmp_path):
    bn = seeded(nn.BatchNorm2d(3, momentum=momentum, affine=affine))
    with torch.no_grad():
        bn.running_mean.copy_(randn(3, seed=7))
        bn.running_var.copy_(randn(3, seed=8).abs() + 0.5)
    x = randn(4, 3, 5, 5, scale=spread) + offset
    res = check(bn, (x,), tmp_path)
    # running_mean, running_var (unbiased batch variance) and num_batches_tracked moved
    # exactly as in PyTorch; the reference side came from nn.BatchNorm2d itself.
    assert {"buffer:inner.running_mean", "buffer:inner.running_var",
            "buffer:inner.num_batches_tracked"} <= set(res.want)
    assert int(res.got["buffer:inner.num_batches_tracked"]) == 1
    assert not np.allclose(res.got["buffer:inner.running_mean"], bn.running_mean.numpy())


def test_batch_norm1d_training(tmp_path):
    bn = seeded(nn.BatchNorm1d(4, momentum=0.2))
    with torch.no_grad():
        bn.running_mean.copy_(randn(4, seed=7))
    res = check(bn, (randn(5, 4, scale=1.5),), tmp_path)
    assert "buffer:inner.running_var" in res.want


@pytest.mark.parametrize("shape,normalized,affine", [
    ((2, 3, 8), 8, True),
    ((2, 3, 4, 5), (4, 5), True),
    ((3, 7), 7, False),
], ids=["last_dim", "two_dims", "no_affine"])
def test_layer_norm(shape, normalized, affine, tmp_path):
    check(seeded(nn.LayerNorm(normalized, elementwise_affine=affine)),
          (randn(*shape, scale=2.0) + 0.5,), tmp_path)


def test_layer_norm_large_mean(tmp_path):
    check(seeded(nn.LayerNorm(8)), (randn(3, 8, scale=0.05) + 50.0,), tmp_path)


@pytest.mark.parametrize("shape,groups,affine", [
    ((2, 6, 5), 3, True),
    ((2, 4, 3, 3), 4, True),  # a group per channel (wav2vec2's first convolution)
    ((3, 6, 4), 2, False),
], ids=["conv1d", "per_channel_2d", "no_affine"])
def test_group_norm(shape, groups, affine, tmp_path):
    check(seeded(nn.GroupNorm(groups, shape[1], affine=affine)),
          (randn(*shape, scale=2.0) + 0.5,), tmp_path)


@pytest.mark.parametrize("dim", [0, 2])
def test_weight_norm(dim, tmp_path):
    """nn.utils.parametrizations.weight_norm (wav2vec2's positional convolution: dim=2):
    the gradients of g and v."""
    conv = nn.utils.parametrizations.weight_norm(seeded(nn.Conv1d(4, 6, 3, padding=1)),
                                                 dim=dim)
    check(conv, (randn(2, 4, 7),), tmp_path)
