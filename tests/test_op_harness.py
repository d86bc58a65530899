"""The op harness itself (op_harness.py): a reference that differs from the C fails."""

from __future__ import annotations

import pytest
from op_harness import randn, run_op
from torch import nn


def test_harness_detects_a_wrong_gradient(tmp_path):
    """A reference that differs from what the C computes must fail the check."""
    res = run_op(nn.Tanh(), (randn(2, 5),), tmp_path)
    res.want["grad:d_in0"] = res.want["grad:d_in0"] * (1 + 2e-4)
    with pytest.raises(AssertionError):
        res.check()
