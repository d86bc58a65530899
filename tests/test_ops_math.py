"""Elementwise math (exp, log, sqrt, rsqrt, reciprocal, abs, pow, clamp, sin, cos): the
generated C against PyTorch, at their kinks too (abs at 0, clamp at its bounds, whose
gradient PyTorch passes there, unlike Hardtanh's).

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import pytest
import torch
from op_harness import Fn, check, randint, randn

import ubitrain as ub

SMOOTH = {
    "exp": (torch.exp, False),
    "log": (torch.log, True),
    "sqrt": (torch.sqrt, True),
    "rsqrt": (torch.rsqrt, True),
    "reciprocal": (torch.reciprocal, True),
    "square": (lambda x: x ** 2, False),
    "cube": (lambda x: x.pow(3), False),
    "pow_1.5": (lambda x: x ** 1.5, True),
    "pow_-0.5": (lambda x: torch.pow(x, -0.5), True),
    "scalar_base": (lambda x: 2.0 ** x, False),
    "exp_of_log": (lambda x: torch.exp(torch.log(x) * 0.5) + torch.sqrt(x), True),
    "sin": (torch.sin, False),
    "cos": (torch.cos, False),
    # as rotary position embeddings use them: angles scaled, both feeding one product
    "sin_cos": (lambda x: torch.sin(3.0 * x) * torch.cos(x) + torch.cos(x * x), False),
}


@pytest.mark.parametrize("name", list(SMOOTH))
def test_smooth(name, tmp_path):
    fn, positive = SMOOTH[name]
    x = randn(2, 3, 4, 4, seed=3, scale=2.0)
    check(Fn(fn), (x.abs() + 0.1 if positive else x,), tmp_path)


KINKED = {
    "abs": torch.abs,
    "clamp": lambda x: x.clamp(-1, 2),
    "clip": lambda x: torch.clip(x, -1, 2),
    "clamp_min": lambda x: torch.clamp_min(x, 0),
    "clamp_max": lambda x: x.clamp(max=2),
    "clamp_crossed_bounds": lambda x: x.clamp(2, -1),  # PyTorch: max wins, zero gradient
    "relu_then_clamp": lambda x: torch.relu(x).clamp(0, 2),
    "clamp_then_abs": lambda x: x.clamp(min=-1).abs() * x,
}


@pytest.mark.parametrize("name", list(KINKED))
def test_kinks_and_ties(name, tmp_path):
    """Integers: many elements exactly at 0, -1 and 2, where the gradient is decided by
    PyTorch's rule (abs: 0 at 0; clamp: passed at both bounds)."""
    x = randint(-3, 4, 2, 3, 4, 4, seed=4).float()
    assert (x == 0).any() and (x == -1).any() and (x == 2).any()
    check(Fn(KINKED[name]), (x,), tmp_path)


@pytest.mark.parametrize("fn,message", [
    (lambda x: x.clamp(min=torch.zeros(4)), "aten.clamp.Tensor is not supported"),
    (lambda x: (-2.0) ** x, "pow(-2.0, tensor) is not supported"),
], ids=["clamp_tensor_bound", "negative_base"])
def test_refused_with_the_op_named(fn, message, tmp_path):
    with pytest.raises(ub.UnsupportedOpError, match=message.replace("(", r"\(").replace(
            ")", r"\)")):
        check(Fn(fn), (randn(2, 3, 4, 4),), tmp_path)
