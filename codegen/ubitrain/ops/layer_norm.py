"""LayerNorm as a fused op (training/fused_ops.py), PyTorch's semantics.

Over the last `axes` dimensions (the "row" of each leading index): mean and biased
variance, y = (x - mean) * rstd * gamma + beta, and the saved mean and rstd per row.
Backward, one kernel: with x_hat = (x - mean) * rstd and g = dy * gamma,
dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) over the row, dgamma = sum over rows of
dy * x_hat, dbeta = sum over rows of dy. Like PyTorch, the backward keeps only x and the two
per-row vectors alive; the decomposed chain (x - mean, the variance, x_hat, the affine
steps) kept four more tensors of x's size per LayerNorm for the backward pass.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .fused_ops import fused_call

FORWARD = "layer_norm"
BACKWARD = "layer_norm_backward"
INPUT_BACKWARD = "layer_norm_input_backward"  # dx alone: gamma and beta frozen


def layer_norm(bb, x, w, b, axes: int, eps: float):
    """Emit the fused op over the last `axes` dimensions of x; return y. `w` or `b` None
    (no elementwise affine, or bias=False) become constant ones and zeros."""
    shape = [int(d) for d in x.ty.shape]
    dtype = str(x.ty.dtype)
    normalized = shape[len(shape) - axes:]
    if w is None:
        w = relax.const(np.ones(normalized, dtype))
    if b is None:
        b = relax.const(np.zeros(normalized, dtype))
    rows = relax.TensorType(shape[:len(shape) - axes], dtype)
    out = bb.emit(fused_call(FORWARD, [x, w, b], [x.ty, rows, rows], axes=axes,
                             eps=float(eps)))
    return bb.emit(relax.TupleGetItem(out, 0))


def layer_norm_grad(orig_var, tensors, output_grad, attrs):
    x, w, _ = tensors
    mean, rstd = relax.TupleGetItem(orig_var, 1), relax.TupleGetItem(orig_var, 2)
    dy = relax.TupleGetItem(output_grad, 0)  # mean and rstd are statistics: no gradient
    grads = fused_call(BACKWARD, [x, w, mean, rstd, dy], [x.ty, w.ty, w.ty],
                       axes=attrs["axes"])
    return [relax.TupleGetItem(grads, i) for i in range(3)]


def input_backward(tensors, attrs) -> relax.Call:
    """The backward call with dx alone (a tensor), for the same tensors and attributes as a
    BACKWARD call whose dgamma and dbeta nothing reads."""
    return fused_call(INPUT_BACKWARD, tensors, tensors[0].ty, **attrs)
