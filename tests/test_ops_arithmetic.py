"""Elementwise arithmetic with broadcasting, cat/stack and tensors made in forward: the
generated C against PyTorch.

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import pytest
import torch
from op_harness import Fn, WithParam, check, randn


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
