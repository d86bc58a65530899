"""Convolutions, Linear and matrix products: the generated C against PyTorch.

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import pytest
import torch
from op_harness import Fn, WithParam, check, randn, seeded
from torch import nn

CONV2D = {
    # name: (Conv2d kwargs, input shape)
    "basic": (dict(in_channels=3, out_channels=4, kernel_size=3), (2, 3, 6, 6)),
    "pad1_nobias": (dict(in_channels=3, out_channels=4, kernel_size=3, padding=1, bias=False),
                    (2, 3, 5, 5)),
    # (8 - 3) % 2 != 0: the last input row and column feed no output.
    "stride2_uncovered": (dict(in_channels=2, out_channels=3, kernel_size=3, stride=2),
                          (2, 2, 8, 8)),
    # (8 + 2 - 3) % 3 != 0: two rows and columns are uncovered.
    "stride3_pad1": (dict(in_channels=2, out_channels=3, kernel_size=3, stride=3, padding=1),
                     (2, 2, 8, 8)),
    "dilation2": (dict(in_channels=2, out_channels=3, kernel_size=3, padding=2, dilation=2),
                  (2, 2, 7, 7)),
    "dilation2_stride2": (dict(in_channels=2, out_channels=2, kernel_size=3, stride=2,
                               dilation=2, padding=1), (2, 2, 8, 8)),
    "groups2": (dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, groups=2),
                (2, 4, 5, 5)),
    "depthwise": (dict(in_channels=3, out_channels=3, kernel_size=3, padding=1, groups=3),
                  (2, 3, 6, 6)),
    "depthwise_stride2_uncovered": (dict(in_channels=4, out_channels=4, kernel_size=3,
                                         stride=2, groups=4, bias=False), (2, 4, 8, 8)),
    "depthwise_multiplier2": (dict(in_channels=2, out_channels=4, kernel_size=3, groups=2,
                                   padding=1, stride=2), (2, 2, 7, 7)),
    "groups2_dilation_stride": (dict(in_channels=4, out_channels=4, kernel_size=2, groups=2,
                                     stride=2, dilation=2, padding=1), (2, 4, 7, 7)),
    "rect_kernel_stride": (dict(in_channels=3, out_channels=2, kernel_size=(3, 1),
                                stride=(2, 1), padding=(1, 0)), (2, 3, 6, 5)),
    "pointwise_stride2": (dict(in_channels=3, out_channels=5, kernel_size=1, stride=2),
                          (2, 3, 7, 7)),
    "padding_valid": (dict(in_channels=2, out_channels=3, kernel_size=3, padding="valid"),
                      (2, 2, 5, 5)),
    # An even kernel: PyTorch pads one more at the end than at the start.
    "padding_same_even_kernel": (dict(in_channels=2, out_channels=3, kernel_size=(2, 4),
                                      padding="same"), (2, 2, 5, 6)),
    "padding_same_dilation": (dict(in_channels=2, out_channels=2, kernel_size=3, dilation=2,
                                   padding="same", groups=2), (2, 2, 6, 6)),
}


@pytest.mark.parametrize("case", list(CONV2D))
def test_conv2d(case, tmp_path):
    kwargs, shape = CONV2D[case]
    check(seeded(nn.Conv2d(**kwargs)), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("kwargs,shape", [
    (dict(in_channels=3, out_channels=4, kernel_size=3, stride=2, padding=1), (2, 3, 10)),
    (dict(in_channels=4, out_channels=4, kernel_size=3, dilation=2, groups=4, bias=False),
     (2, 4, 9)),
    (dict(in_channels=2, out_channels=3, kernel_size=4, padding="same"), (2, 2, 7)),
    (dict(in_channels=2, out_channels=3, kernel_size=2, padding="valid"), (2, 2, 7)),
], ids=["stride2_pad1", "depthwise_dilation2", "padding_same", "padding_valid"])
def test_conv1d(kwargs, shape, tmp_path):
    check(seeded(nn.Conv1d(**kwargs)), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("shape,bias", [((3, 6), True), ((2, 3, 6), True), ((2, 3, 6), False)],
                         ids=["2d", "3d", "3d_nobias"])
def test_linear(shape, bias, tmp_path):
    check(seeded(nn.Linear(6, 4, bias=bias)), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("fn,wshape,shape", [
    (lambda x, w: x @ w, (4, 5), (3, 4)),
    (lambda x, w: torch.mm(x * w, (x + w).t()), (3, 4), (3, 4)),  # both sides trained
    (lambda x, w: torch.bmm(x, w), (2, 4, 5), (2, 3, 4)),
    (lambda x, w: x @ w, (4, 5), (2, 3, 4)),  # the 2-D side broadcasts over the batch
    (lambda x, w: x @ w, (3, 4, 5), (2, 1, 3, 4)),  # both sides broadcast
    (lambda x, w: w @ x, (2, 1, 5, 3), (4, 3, 2)),
    (lambda x, w: (x * w) @ (x - w).transpose(-1, -2), (1, 3, 1, 4), (2, 3, 2, 4)),
    (lambda x, w: x @ w, (4,), (2, 3, 4)),  # matrix . vector
    (lambda x, w: w @ x, (3,), (2, 3, 4)),  # vector . matrix
    (lambda x, w: (x @ w).reshape(1), (4,), (4,)),  # vector . vector
    (lambda x, w: torch.baddbmm(x[:, :, :1], x, w, beta=0.5, alpha=2.0), (2, 4, 5),
     (2, 3, 4)),
    (lambda x, w: torch.baddbmm(x, x, w, beta=0.0), (2, 4, 4), (2, 3, 4)),  # x unread
    (lambda x, w: torch.addmm(w[0], x, w, alpha=-1.5), (4, 4), (3, 4)),
], ids=["2d", "mm_both_trained", "bmm", "broadcast_2d", "broadcast_both", "broadcast_left",
        "4d_both_trained", "matrix_vector", "vector_matrix", "vector_vector", "baddbmm",
        "baddbmm_beta0", "addmm"])
def test_matmul(fn, wshape, shape, tmp_path):
    check(WithParam(fn, wshape), (randn(*shape),), tmp_path)


def test_matmul_two_inputs(tmp_path):
    """x @ (a linear branch of x): the gradient reaches both inputs through both sides."""
    fn = lambda a, b: a @ b.transpose(1, 2) @ b  # noqa: E731
    check(Fn(fn), (randn(2, 3, 4, seed=1), randn(2, 5, 4, seed=2)), tmp_path)
