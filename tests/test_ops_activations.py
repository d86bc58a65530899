"""Activations (at their kinks and ties too), Softmax and LogSoftmax: the generated C
against PyTorch.

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from op_harness import Fn, Probed, check, randint, randn, seeded
from torch import nn


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
