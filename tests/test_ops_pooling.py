"""Pools (max, average, 1-D, 2-D, adaptive) and mean/sum reductions: the generated C against
PyTorch.

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from op_harness import Fn, Probed, check, randint, randn, run_op
from torch import nn
from torch.nn import functional as F

import ubitrain as ub
from ubitrain.frontend.aten.pooling import _even_windows

MAXPOOL = {
    "k2": (dict(kernel_size=2), randn(2, 3, 6, 6)),
    "k3_s2_p1": (dict(kernel_size=3, stride=2, padding=1), randn(2, 2, 7, 7)),
    "k2_s1_overlap": (dict(kernel_size=2, stride=1), randn(2, 2, 5, 5)),
    "k3_s2_uncovered": (dict(kernel_size=3, stride=2), randn(2, 2, 8, 8)),
    # Integer values: windows hold several equal maxima; PyTorch picks the first in scan
    # order, and overlapping windows may pick the same element twice.
    "ties_k2": (dict(kernel_size=2), randint(-2, 2, 2, 2, 6, 6, seed=5)),
    "ties_k3_s2_p1": (dict(kernel_size=3, stride=2, padding=1),
                      randint(-1, 2, 2, 2, 7, 7, seed=6)),
    "ties_k2_s1": (dict(kernel_size=2, stride=1), randint(0, 2, 2, 2, 5, 5, seed=7)),
    # ceil_mode: a last, partial window; PyTorch drops a window that starts in the padding.
    "ceil_k2_s2": (dict(kernel_size=2, ceil_mode=True), randn(2, 2, 5, 5)),
    "dilation2_ties": (dict(kernel_size=2, stride=1, dilation=2, padding=1),
                       randint(-1, 2, 2, 2, 6, 6, seed=8)),
    "ceil_k2_s3_p1_dropped": (dict(kernel_size=2, stride=3, padding=1, ceil_mode=True),
                              randn(2, 2, 5, 5)),
}


@pytest.mark.parametrize("case", list(MAXPOOL))
def test_max_pool2d(case, tmp_path):
    kwargs, x = MAXPOOL[case]
    check(nn.MaxPool2d(**kwargs), (x,), tmp_path)


@pytest.mark.parametrize("kwargs", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1)],
                         ids=["k2", "k3_s2_p1"])
def test_max_pool2d_after_relu_zero_windows(kwargs, tmp_path):
    """Windows that are all zero after a ReLU: the gradient goes to the first zero."""
    x = randn(2, 2, 6, 6, seed=9) - 1.0  # mostly negative: many all-zero windows
    x[:, :, :2, :2] = -1.0
    res = check(Probed(nn.ReLU(), nn.MaxPool2d(**kwargs), x.shape), (x,), tmp_path)
    assert np.any(res.got["grad:d_probe"][x.numpy() < 0] != 0)


AVGPOOL = {
    "k2": (dict(kernel_size=2), (2, 3, 6, 6)),
    "k3_s2_p1_include_pad": (dict(kernel_size=3, stride=2, padding=1), (2, 2, 7, 7)),
    "k3_s2_p1_exclude_pad": (dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                             (2, 2, 7, 7)),
    "k3_s2_uncovered": (dict(kernel_size=3, stride=2), (2, 2, 8, 8)),
    "k2_s1_p1_exclude_pad": (dict(kernel_size=2, stride=1, padding=1, count_include_pad=False),
                             (2, 2, 5, 5)),
    "ceil_k2_s2": (dict(kernel_size=2, ceil_mode=True), (2, 2, 5, 5)),
    "ceil_k3_s2_p1_include_pad": (dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                                  (2, 2, 6, 6)),
    "ceil_k3_s2_p1_exclude_pad": (dict(kernel_size=3, stride=2, padding=1, ceil_mode=True,
                                       count_include_pad=False), (2, 2, 6, 6)),
    "ceil_k2_s3_p1_dropped": (dict(kernel_size=2, stride=3, padding=1, ceil_mode=True),
                              (2, 2, 5, 5)),
}


@pytest.mark.parametrize("case", list(AVGPOOL))
def test_avg_pool2d(case, tmp_path):
    kwargs, shape = AVGPOOL[case]
    check(nn.AvgPool2d(**kwargs), (randn(*shape),), tmp_path)


POOL1D = {
    # name: (module, input); lengths chosen so that windows overlap, leave elements
    # uncovered, or (ceil_mode) end in a partial last window.
    "max_k2": (nn.MaxPool1d(2), randn(2, 3, 9)),
    "max_k3_s2_p1": (nn.MaxPool1d(3, 2, 1), randn(2, 2, 10)),
    "max_k3_s2_uncovered": (nn.MaxPool1d(3, 2), randn(2, 2, 8)),
    "max_ceil_k2_s2": (nn.MaxPool1d(2, ceil_mode=True), randn(2, 2, 7)),
    "max_ceil_k3_s2_p1": (nn.MaxPool1d(3, 2, 1, ceil_mode=True), randn(2, 2, 8)),
    "max_ceil_k2_s3_p1_dropped": (nn.MaxPool1d(2, 3, 1, ceil_mode=True), randn(2, 2, 5)),
    "max_ties_k3_s1": (nn.MaxPool1d(3, 1), randint(-1, 2, 2, 2, 9, seed=10)),
    "max_ties_k3_s2_p1": (nn.MaxPool1d(3, 2, 1), randint(-1, 2, 2, 2, 9, seed=11)),
    "max_ties_dilation2": (nn.MaxPool1d(2, 1, 1, dilation=2), randint(-1, 2, 2, 2, 8, seed=12)),
    "max_unbatched": (nn.MaxPool1d(3, 2), randn(3, 9)),
    "max_functional": (Fn(lambda x: F.max_pool1d(x, 2, 1, 1)), randn(2, 2, 6)),
    "avg_k2": (nn.AvgPool1d(2), randn(2, 3, 9)),
    "avg_k3_s2_p1_include_pad": (nn.AvgPool1d(3, 2, 1), randn(2, 2, 10)),
    "avg_k3_s2_p1_exclude_pad": (nn.AvgPool1d(3, 2, 1, count_include_pad=False),
                                 randn(2, 2, 10)),
    "avg_ceil_k3_s2_p1_include_pad": (nn.AvgPool1d(3, 2, 1, ceil_mode=True), randn(2, 2, 8)),
    "avg_ceil_k3_s2_p1_exclude_pad": (nn.AvgPool1d(3, 2, 1, ceil_mode=True,
                                                   count_include_pad=False), randn(2, 2, 8)),
    "avg_ceil_k2_s3_p1_dropped": (nn.AvgPool1d(2, 3, 1, ceil_mode=True), randn(2, 2, 5)),
    "avg_unbatched": (nn.AvgPool1d(2, 1), randn(3, 7)),
    "avg_functional": (Fn(lambda x: F.avg_pool1d(x, 3, 1, 1, count_include_pad=False)),
                       randn(2, 2, 6)),
}


@pytest.mark.parametrize("case", list(POOL1D))
def test_pool1d(case, tmp_path):
    module, x = POOL1D[case]
    check(module, (x,), tmp_path)


ADAPTIVE = {
    # name: (output size, input shape). PyTorch's windows [floor(i * H / OH),
    # ceil((i + 1) * H / OH)) are even where OH divides H, and sometimes otherwise (7 -> 3:
    # kernel 3, stride 2): a plain pool. Else they differ in size or spacing (and overlap), or
    # repeat rows where OH > H: ubitrain's adaptive kernels.
    "global": (1, (2, 3, 5, 6)),
    "divisible_6x4_to_3x2": ((3, 2), (2, 2, 6, 4)),
    "even_7_to_3": (3, (2, 2, 7, 7)),
    "uneven_6_to_4": (4, (2, 2, 6, 6)),
    "uneven_5x6_to_2x4": ((2, 4), (2, 2, 5, 6)),
    "repeat_1_to_3": (3, (2, 2, 1, 1)),
    "repeat_2x5_to_3x7": ((3, 7), (2, 2, 2, 5)),
    "none_keeps_height": ((None, 3), (2, 2, 4, 7)),
    "none_uneven": ((None, 4), (2, 2, 3, 6)),
    "unbatched_uneven_5_to_3": (3, (2, 5, 5)),
}
ADAPTIVE_1D = {
    "divisible_8_to_4": (4, (2, 3, 8)),
    "even_7_to_3": (3, (2, 2, 7)),
    "uneven_10_to_4": (4, (2, 2, 10)),
    "repeat_2_to_5": (5, (2, 2, 2)),
    "unbatched_6_to_4": (4, (3, 6)),
}


@pytest.mark.parametrize("case", list(ADAPTIVE))
@pytest.mark.parametrize("cls", [nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d], ids=["avg", "max"])
def test_adaptive_pool2d(cls, case, tmp_path):
    out, shape = ADAPTIVE[case]
    check(cls(out), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("case", list(ADAPTIVE_1D))
@pytest.mark.parametrize("cls", [nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d], ids=["avg", "max"])
def test_adaptive_pool1d(cls, case, tmp_path):
    out, shape = ADAPTIVE_1D[case]
    check(cls(out), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("out,shape,seed", [(3, (2, 2, 7, 7), 13), ((2, 4), (2, 2, 5, 6), 14),
                                            (2, (2, 2, 4, 4), 15), ((4, 3), (2, 2, 6, 5), 16)],
                         ids=["even_7_to_3", "uneven_5x6_to_2x4", "divisible", "uneven_6x5_to_4x3"])
def test_adaptive_max_pool2d_ties(out, shape, seed, tmp_path):
    """Integer inputs: windows hold several equal maxima; PyTorch gives each window's
    gradient to the first in scan order, and overlapping windows may pick the same one."""
    check(nn.AdaptiveMaxPool2d(out), (randint(-1, 2, *shape, seed=seed),), tmp_path)


@pytest.mark.parametrize("act,pool", [
    (nn.ReLU(), nn.AdaptiveMaxPool2d((4, 3))), (nn.ReLU(), nn.AdaptiveAvgPool2d((4, 3))),
    (nn.Tanh(), nn.AdaptiveAvgPool2d((4, 3))), (nn.ReLU(), nn.MaxPool1d(2)),
    (nn.Tanh(), nn.AvgPool1d(2, 3)),
], ids=["relu_adaptive_max", "relu_adaptive_avg", "tanh_adaptive_avg", "relu_max1d",
        "tanh_avg1d_stride_past_kernel"])
def test_pool_after_activation(act, pool, tmp_path):
    """The pool's gradient feeds the activation's (which may join its kernel): the gradient
    w.r.t. the activation's input, ReLU's zeros and all-zero max windows included."""
    shape = (2, 2, 6, 5) if isinstance(pool, (nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool2d)) \
        else (2, 2, 9)
    x = randn(*shape, seed=18) - 0.5
    check(Probed(act, pool, shape), (x,), tmp_path)


@pytest.mark.parametrize("pool", [nn.AdaptiveMaxPool2d((4, 3)), nn.AdaptiveAvgPool2d((4, 3))],
                         ids=["max", "avg"])
def test_activation_after_adaptive_pool(pool, tmp_path):
    """The ReLU after the pool joins the pool's kernel in the forward pass."""
    check(nn.Sequential(pool, nn.ReLU()), (randn(2, 2, 6, 5, seed=19),), tmp_path)


def test_adaptive_max_pool1d_ties(tmp_path):
    check(nn.AdaptiveMaxPool1d(4), (randint(0, 2, 2, 2, 10, seed=17),), tmp_path)


def test_adaptive_even_windows_are_plain_pools():
    """Where the frontend lowers an adaptive pool to a plain one, PyTorch agrees."""
    for size in range(1, 17):
        for out in range(1, 17):
            even = _even_windows(size, out)
            if even is None:
                continue
            x = randn(1, 2, size, seed=size * 17 + out).double()
            torch.testing.assert_close(F.avg_pool1d(x, *even), F.adaptive_avg_pool1d(x, out))
            torch.testing.assert_close(F.max_pool1d(x, *even), F.adaptive_max_pool1d(x, out))


@pytest.mark.parametrize("fn", [
    lambda x: x.mean(dim=(2, 3)),
    lambda x: x.mean(dim=1, keepdim=True),
    lambda x: torch.mean(x, -1),
    lambda x: x.mean().reshape(1),
    lambda x: x.mean(dim=[]).reshape(1),
    lambda x: x.mean(dim=(1, 3), keepdim=True) + x.sum(dim=[0, 2], keepdim=True),
    lambda x: x.sum().reshape(1, 1, 1) * x.mean(dim=1, keepdim=True).squeeze(),
], ids=["hw", "channel_keepdim", "last", "all", "empty_dims_is_all", "sum_and_mean",
        "sum_all_squeeze_all"])
def test_mean(fn, tmp_path):
    check(Fn(fn), (randn(2, 3, 4, 5),), tmp_path)


def test_adaptive_max_pool_indices_are_a_clear_error(tmp_path):
    class WithIndices(nn.Module):
        def forward(self, x):
            y, idx = F.adaptive_max_pool2d(x, 3, return_indices=True)
            return y + idx

    with pytest.raises(ub.UnsupportedOpError, match="return_indices"):
        run_op(WithIndices(), (randn(2, 2, 6, 6),), tmp_path)
