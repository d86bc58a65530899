"""Every op of the supported table: forward and gradients from the generated C vs PyTorch.

Each case compiles one small module wrapped by `op_harness.OpProbe`, takes one SGD(lr=1)
step on the MSE loss and compares, with relative error <= 1e-4 per tensor:
the training-mode forward output and loss, the eval-mode forward (`predict`), the gradient
w.r.t. every input and every parameter, and the state that training updates (BatchNorm).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from op_harness import reference_dropout, rel_err, run_op
from torch import nn
from torch.nn import functional as F

import ubitrain as ub
from ubitrain.fidelity.dropout import dropout_masks
from ubitrain.frontend.aten.pooling import _even_windows


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def randint(low, high, *shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=gen).float()


def seeded(module: nn.Module, seed: int = 0) -> nn.Module:
    """Give a module's parameters reproducible, non-trivial values."""
    gen = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module


class Fn(nn.Module):
    """A stateless op as a module: `fn(*inputs)`."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class WithParam(nn.Module):
    """`fn(x, w)` with `w` a parameter: broadcasting against a trained tensor."""

    def __init__(self, fn, shape, seed=0):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(randn(*shape, seed=50 + seed))

    def forward(self, x):
        return self.fn(x, self.w)


class Probed(nn.Module):
    """`after(before(x) + probe)`: `probe` is a zero parameter, so its gradient is the
    gradient w.r.t. the intermediate `before(x)` (e.g. the exact zeros after a ReLU)."""

    def __init__(self, before, after, mid_shape):
        super().__init__()
        self.before, self.after = before, after
        self.probe = nn.Parameter(torch.zeros(mid_shape))

    def forward(self, x):
        return self.after(self.before(x) + self.probe)


def check(inner, inputs, tmp_path, **kw):
    res = run_op(inner, inputs, tmp_path, **kw)
    res.check()
    return res


# ---- convolution --------------------------------------------------------------------------
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


# ---- normalisation ------------------------------------------------------------------------
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


# ---- activations --------------------------------------------------------------------------
def _activation_input():
    """Random values around the breakpoints plus the breakpoints themselves."""
    x = randn(2, 3, 4, 4, seed=3, scale=3.0)
    flat = x.view(-1)
    flat[:12] = torch.tensor([0.0, 0.0, 6.0, 6.0, -3.0, 3.0, -6.0, 0.0, 6.0, 3.0, -1.0, 1.0])
    return x


ACTIVATIONS = {
    "relu": nn.ReLU(),
    "relu6": nn.ReLU6(),
    "gelu": nn.GELU(),
    "gelu_tanh": nn.GELU(approximate="tanh"),
    "silu": nn.SiLU(),
    "sigmoid": nn.Sigmoid(),
    "tanh": nn.Tanh(),
    "hardswish": nn.Hardswish(),
    "hardtanh": nn.Hardtanh(),
    "hardsigmoid": nn.Hardsigmoid(),
    "hardsigmoid_inplace": nn.Hardsigmoid(inplace=True),
    "hardsigmoid_functional": Fn(torch.nn.functional.hardsigmoid),
    "leaky_relu": nn.LeakyReLU(),
    "leaky_relu_0.2_inplace": nn.LeakyReLU(0.2, inplace=True),
    "leaky_relu_negative_slope": nn.LeakyReLU(-0.5),
    "leaky_relu_slope_above_1": Fn(lambda x: torch.nn.functional.leaky_relu(x, 1.5)),
    "elu": nn.ELU(),
    "elu_0.5_inplace": nn.ELU(alpha=0.5, inplace=True),
    "elu_negative_alpha": Fn(lambda x: torch.nn.functional.elu(x, alpha=-0.7)),
    "elu_scale_input_scale": Fn(lambda x: torch.ops.aten.elu(x, 1.7, 1.05, 0.5)),
    "selu": nn.SELU(),
    "selu_inplace": nn.SELU(inplace=True),
    "celu_0.7": nn.CELU(0.7),
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation(name, tmp_path):
    check(ACTIVATIONS[name], (_activation_input(),), tmp_path)


@pytest.mark.parametrize("act", [nn.ReLU(), nn.ReLU6()], ids=["relu", "relu6"])
def test_activation_ties(act, tmp_path):
    """Exactly 0 (and 6) after a ReLU feed the activation: PyTorch's gradient is 0 there."""
    x = randint(-3, 9, 2, 3, 4, 4, seed=4)  # integers: many exact 0s and 6s
    assert (x == 0).any() and (x == 6).any()
    res = check(Probed(nn.ReLU(), act, x.shape), (x,), tmp_path)
    mid_grad = res.got["grad:d_probe"]
    assert np.all(mid_grad[x.numpy() <= 0] == 0)


KINKS = {  # name: (activation, the inputs where its derivative jumps)
    "hardsigmoid": (nn.Hardsigmoid(), (-3.0, 3.0)),
    "hardsigmoid_inplace": (nn.Hardsigmoid(inplace=True), (-3.0, 3.0)),
    "leaky_relu": (nn.LeakyReLU(0.2), (0.0,)),
    "leaky_relu_inplace": (nn.LeakyReLU(0.2, inplace=True), (0.0,)),
    "leaky_relu_negative_slope": (nn.LeakyReLU(-0.5), (0.0,)),
    "elu_0.5": (nn.ELU(alpha=0.5), (0.0,)),
    "elu_2_inplace": (nn.ELU(alpha=2.0, inplace=True), (0.0,)),
}


@pytest.mark.parametrize("name", list(KINKS))
def test_activation_kinks(name, tmp_path):
    """Exactly at a kink PyTorch takes one side's slope (Hardsigmoid: 0 at -3 and 3;
    LeakyReLU and ELU: the negative side's at 0); the C must take the same side, element by
    element, not only within the tensor's tolerance."""
    act, kinks = KINKS[name]
    x = randint(-4, 5, 2, 3, 4, 4, seed=9)  # integers: many inputs exactly at each kink
    assert all((x == k).any() for k in kinks)
    res = check(act, (x,), tmp_path)
    at = np.isin(x.numpy(), kinks)
    np.testing.assert_allclose(res.got["grad:d_in0"][at], res.want["grad:d_in0"][at], rtol=1e-4)


def test_elu_small_inputs(tmp_path):
    """Inputs of 1e-5: expm1 as exp(x) - 1 in float32 would keep only two digits of y."""
    check(nn.ELU(alpha=1.5), (randn(2, 3, 8, seed=10, scale=1e-5),), tmp_path)


SOFTMAX = {
    "softmax_last": nn.Softmax(dim=-1),
    "softmax_channel": nn.Softmax(dim=1),
    "softmax_batch": nn.Softmax(dim=0),
    "softmax_dim_minus3": Fn(lambda x: torch.softmax(x, -3)),
    "softmax_dtype": Fn(lambda x: torch.nn.functional.softmax(x, 2, dtype=torch.float32)),
    "softmax2d": nn.Softmax2d(),
    "aten_softmax": Fn(lambda x: torch.ops.aten._softmax(x, 3, False)),
    "log_softmax_last": nn.LogSoftmax(dim=-1),
    "log_softmax_channel": nn.LogSoftmax(dim=1),
    "log_softmax_dim2": Fn(lambda x: torch.nn.functional.log_softmax(x, dim=2)),
    "log_softmax_batch": Fn(lambda x: x.log_softmax(-4)),
    "aten_log_softmax": Fn(lambda x: torch.ops.aten._log_softmax(x, -1, False)),
}


@pytest.mark.parametrize("name", list(SOFTMAX))
def test_softmax(name, tmp_path):
    check(SOFTMAX[name], (randn(2, 3, 4, 5, seed=11, scale=2.0),), tmp_path)


@pytest.mark.parametrize("act", [nn.Softmax(dim=1), nn.LogSoftmax(dim=-1)],
                         ids=["softmax", "log_softmax"])
def test_softmax_large_logits(act, tmp_path):
    """Logits near 200 with a spread of 30: exp overflows float32 unless each row's maximum
    is subtracted first."""
    check(act, (randn(3, 6, 4, seed=12, scale=30.0) + 200.0,), tmp_path)


def test_softmax_then_log_softmax_inside_a_model(tmp_path):
    """Softmax and LogSoftmax between trained layers, over different dims."""
    model = seeded(nn.Sequential(nn.Linear(5, 6), nn.Softmax(dim=1), nn.Linear(6, 4),
                                 nn.LogSoftmax(dim=-1)))
    check(model, (randn(3, 5, seed=13),), tmp_path)


# ---- pooling and reductions ---------------------------------------------------------------
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


# ---- layout -------------------------------------------------------------------------------
@pytest.mark.parametrize("fn,wshape", [
    (lambda x, w: torch.flatten(x, 1) * w, (60,)),
    (lambda x, w: x.reshape(2, -1, 4) * w, (15, 4)),
    (lambda x, w: x.view(6, 20).sum(dim=0) * w, (20,)),
    (lambda x, w: x.permute(0, 2, 3, 1) * w, (4, 5, 3)),
    (lambda x, w: x.transpose(1, 2).flatten(2) * w, (4, 15)),
    (lambda x, w: x.transpose(-1, 0).reshape(-1) * w, (120,)),
    (lambda x, w: x.flatten().unsqueeze(0).squeeze(0)[None] * w + x.view(1, -1), (120,)),
    (lambda x, w: x.reshape(6, 20).t() * w, (20, 6)),
    (lambda x, w: x[:, :1].expand(-1, 3, -1, -1) * w, (4, 5)),
    (lambda x, w: x * w.expand(2, 3, 4, 5), (4, 1)),  # new leading dims: a class token
    (lambda x, w: x.flip(1) * w, (3, 4, 5)),
    (lambda x, w: x.flip([0, -1]) * w, (3, 4, 5)),
], ids=["flatten", "reshape", "view_sum", "permute", "transpose", "transpose_neg",
        "squeeze_unsqueeze", "t", "expand", "expand_new_dims", "flip", "flip_two_axes"])
def test_layout(fn, wshape, tmp_path):
    """Each layout op is followed by a product with a trained tensor, so an element in the
    wrong place gives a wrong output and wrong gradients."""
    check(WithParam(fn, wshape), (randn(2, 3, 4, 5),), tmp_path)


@pytest.mark.parametrize("fn,wshape,shape", [
    (lambda x, w: torch.chunk(x, 2, 1)[0] * w + torch.chunk(x, 2, 1)[1], (2, 5), (2, 4, 5)),
    # only the last, shorter part is used: the others' gradient is zero
    (lambda x, w: x.chunk(3, -1)[2] * w, (4, 1), (2, 4, 7)),
    (lambda x, w: torch.cat([torch.split(x, 2, -1)[0] * w, torch.split(x, 2, -1)[2]], -1),
     (2,), (3, 4, 5)),
    (lambda x, w: torch.split(x, [1, 2, 4], 1)[1] * w, (2, 3), (2, 7, 3)),
    (lambda x, w: sum(t * w[i] for i, t in enumerate(x.unbind(-1))), (3, 4), (2, 3, 4, 3)),
    (lambda x, w: x.unbind(1)[1] * w, (3,), (2, 4, 3)),
    (lambda x, w: x.narrow(1, 1, 2) * w, (2, 3), (2, 4, 3)),
    (lambda x, w: x[:, 0] * w + x[:, -1], (3,), (2, 4, 3)),
    (lambda x, w: x[:, 1:5] * w, (4, 3), (2, 6, 3)),
    (lambda x, w: x[:, -3:-1] * w, (2, 3), (2, 6, 3)),
    (lambda x, w: x[..., ::2] * w, (3,), (2, 6, 5)),
    (lambda x, w: x[:, 1::3, :] * w, (2, 5), (2, 6, 5)),  # the last kept is not the last
    (lambda x, w: x[1:, ::2, -2] * w, (2, 5), (3, 4, 3, 5)),  # batch, step and select
    (lambda x, w: x[3:9:2] * w + x.narrow(0, 0, 3) + x[-1], (3,), (10,)),
    (lambda x, w: x.view(2, 3, 2, 2, 3)[:, :, 1, :, 1:] * w, (3, 2, 2), (2, 3, 4, 3)),
], ids=["chunk_both", "chunk_last_only", "split_skip_middle", "split_sizes", "unbind_all",
        "unbind_one", "narrow", "select", "slice", "slice_negative", "slice_step2",
        "slice_step3_tail", "slice_chain", "slices_1d", "slice_rank5"])
def test_slicing(fn, wshape, shape, tmp_path):
    """Every part is multiplied by a trained tensor or summed, so a wrong element gives a
    wrong output; the input's gradient is zero exactly where no part reads it."""
    check(WithParam(fn, wshape), (randn(*shape),), tmp_path)


@pytest.mark.parametrize("fn,wshape,shape", [
    (lambda x, w: x.view(4, 6).t().reshape(-1) * w + x.t(), (24,), (24,)),
    (lambda x, w: x.permute(2, 0, 1) * w, (2, 1), (2, 3, 4)),
    (lambda x, w: (x.view(2, 3, 2, 2, 5).permute(4, 0, 3, 2, 1) * w).reshape(5, 24),
     (2, 2, 3), (2, 3, 4, 5)),
    (lambda x, w: x.view(2, 3, 2, 2, 5).transpose(1, -1).flatten(3) * w, (6,), (2, 3, 4, 5)),
    (lambda x, w: x.transpose(0, 2).contiguous().view(4, -1) * w, (30,), (2, 3, 4, 5)),
], ids=["1d", "3d_permute", "5d_permute", "5d_transpose", "4d_swap_batch"])
def test_layout_ranks(fn, wshape, shape, tmp_path):
    check(WithParam(fn, wshape), (randn(*shape),), tmp_path)


# ---- elementwise arithmetic ---------------------------------------------------------------
@pytest.mark.parametrize("fn,wshape", [
    (lambda x, w: x + w, (3, 1, 1)),
    (lambda x, w: x - w, (1, 3, 1, 1)),
    (lambda x, w: x * w, (3, 1, 5)),
    (lambda x, w: w / (x * x + 1.0), (4, 5)),
    (lambda x, w: (x * w) * 0.5 - 1.5 + w, (1,)),
    (lambda x, w: 2.0 - x * w, (2, 1, 4, 1)),
    (lambda x, w: torch.sub(x, w, alpha=2.0) + torch.add(-x, w, alpha=0.5), (5,)),
    (lambda x, w: x / 4.0 * w + 3 * x, (1, 1, 4, 5)),
], ids=["add_c11", "sub_1c11", "mul_c1w", "div_hw", "scalars", "rsub_n1h1", "alpha_neg",
        "int_scalar"])
def test_broadcast_arith(fn, wshape, tmp_path):
    check(WithParam(fn, wshape), (randn(2, 3, 4, 5),), tmp_path)


@pytest.mark.parametrize("shapes", [[(2, 3, 4, 5), (2, 1, 4, 1)], [(2, 1, 4, 1), (1, 3, 1, 5)]],
                         ids=["one_side", "both_sides"])
def test_binary_two_inputs(shapes, tmp_path):
    """Both operands are inputs, broadcast against each other."""
    fn = lambda a, b: a * b + (a - b) / (b * b + 1.0)  # noqa: E731
    check(Fn(fn), tuple(randn(*s, seed=i) for i, s in enumerate(shapes)), tmp_path)


@pytest.mark.parametrize("fn,shapes", [
    (lambda a, b: torch.cat([a, b], dim=1), [(2, 3, 4), (2, 2, 4)]),
    (lambda a, b: torch.cat([b, a * 2.0, b], dim=-1), [(2, 3, 4), (2, 3, 1)]),
    (lambda a, b: torch.cat([a], dim=1) * b, [(2, 3, 4), (2, 3, 4)]),
    (lambda a, b: torch.stack([a, b * 2.0, a], dim=1), [(2, 3, 4), (2, 3, 4)]),
    (lambda a, b: torch.stack([b, a], dim=-1) + torch.stack([a], dim=2), [(2, 3), (2, 3)]),
], ids=["dim1", "last_dim_repeated", "one_tensor", "stack", "stack_last_and_one"])
def test_cat(fn, shapes, tmp_path):
    check(Fn(fn), tuple(randn(*s, seed=i) for i, s in enumerate(shapes)), tmp_path)


# ---- tensors made in forward --------------------------------------------------------------
@pytest.mark.parametrize("fn,wshape", [
    (lambda x, w: x * w + torch.zeros(2, 4), (4,)),
    (lambda x, w: x * torch.ones(4) + w, (4,)),
    (lambda x, w: x * torch.full((2, 4), 1.5) * w, (4,)),
    (lambda x, w: x * torch.full((2, 4), 2) * w, (4,)),  # an int64 fill, promoted
    (lambda x, w: x + torch.arange(4) * w, (4,)),  # int64, promoted
    (lambda x, w: x * torch.arange(1, 9, 2, dtype=torch.float32) * w, (4,)),
    (lambda x, w: x * torch.arange(0.1, 0.4, 0.1) * w, (4,)),  # 4 values, not 3: rounding
    (lambda x, w: (2.5 - torch.arange(4) / 2) * x * w, (4,)),  # int64 / int: true division
    (lambda x, w: (x + torch.zeros_like(x)) * torch.ones_like(x) * torch.full_like(x, 2.0) * w,
     (4,)),
    (lambda x, w: (x + x.new_zeros(2, 4)) * x.new_ones(4) * x.new_full((1, 4), -0.5) * w,
     (4,)),
    (lambda x, w: torch.cat([x * w, torch.zeros(2, 2)], 1), (4,)),
], ids=["zeros", "ones", "full", "full_int", "arange_int", "arange_step", "arange_float_step",
        "arange_div", "like", "new", "cat_zeros"])
def test_creation(fn, wshape, tmp_path):
    check(WithParam(fn, wshape), (randn(2, 4),), tmp_path)


# ---- dropout ------------------------------------------------------------------------------
class TwoDropouts(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.drop1, self.drop2 = nn.Dropout(p), nn.Dropout(p)

    def forward(self, x):
        return self.drop2(torch.tanh(self.drop1(self.fc(x))))


def test_splitmix64_reference():
    """The numpy generator is SplitMix64 (reference outputs for seed 0 and 1234567)."""
    from ubitrain.fidelity.dropout import splitmix64
    draws, _ = splitmix64(0, 3)
    assert [int(d) for d in draws] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    draws, _ = splitmix64(1234567, 3)
    assert [int(d) for d in draws] == [6457827717110365317, 3203168211198807973,
                                       9817491932198370423]


@pytest.mark.parametrize("seed", [0, 7])
def test_dropout(seed, tmp_path):
    p = 0.4
    x = randn(4, 6)
    masks = dropout_masks(seed, [(4, 8), (4, 8)], p)
    assert 0 < sum(int((m == 0).sum()) for m in masks) < 64
    check(seeded(TwoDropouts(p)), (x,), tmp_path, seed=seed, dropout_masks=masks)


def test_dropout_masks_redrawn_each_step(tmp_path):
    """The generator's state runs on across steps: step 2 uses the next draws."""
    p, seed = 0.4, 3
    model = seeded(TwoDropouts(p))
    x, y = randn(4, 6), randn(4, 8, seed=1)
    pkg = ub.compile(model, (x,), y, loss="mse", optimizer=ub.SGD(lr=0.5),
                     out_dir=tmp_path / "drop")
    tr = pkg.build(seed=seed)
    ref = copy.deepcopy(model).double()
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    masks = dropout_masks(seed, [(4, 8)] * 4, p)  # step 1: masks 0, 1; step 2: masks 2, 3
    for step in range(2):
        with reference_dropout(masks[2 * step:2 * step + 2]):
            loss = torch.mean((ref(x.double()) - y.double()) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert rel_err(tr.step(x, y), loss.item()) <= 1e-4
    got = tr.parameters()
    for name, value in ref.state_dict().items():
        assert rel_err(got[name], value.numpy()) <= 1e-4, name


def test_dropout_p0_is_identity(tmp_path):
    res = check(seeded(TwoDropouts(0.0)), (randn(4, 6),), tmp_path)
    assert rel_err(res.got["predict"], res.want["output"]) <= 1e-4


# ---- the harness itself -------------------------------------------------------------------
def test_harness_detects_a_wrong_gradient(tmp_path):
    """A reference that differs from what the C computes must fail the check."""
    res = run_op(nn.Tanh(), (randn(2, 5),), tmp_path)
    res.want["grad:d_in0"] = res.want["grad:d_in0"] * (1 + 2e-4)
    with pytest.raises(AssertionError):
        res.check()


def test_adaptive_max_pool_indices_are_a_clear_error(tmp_path):
    class WithIndices(nn.Module):
        def forward(self, x):
            y, idx = F.adaptive_max_pool2d(x, 3, return_indices=True)
            return y + idx

    with pytest.raises(ub.UnsupportedOpError, match="return_indices"):
        run_op(WithIndices(), (randn(2, 2, 6, 6),), tmp_path)
