"""Training-mode BatchNorm as a fused op (training/fused_ops.py), PyTorch's semantics.

Forward, two kernels (lowering/batch_norm_kernels.py): the batch mean and biased variance
per channel, the new running statistics (momentum, the unbiased variance) and the saved
mean and rstd; then y = x * alpha + beta' (alpha = rstd * gamma, beta' = beta - mean * alpha,
as PyTorch's CPU forward computes it), which the activation or residual add after it joins
(lowering/fusion.py). Backward, one kernel: with
x_hat = (x - mean) * rstd, dbeta = sum(dy), dgamma = sum(dy * x_hat) and
dx = gamma * rstd * (dy - mean(dy) - x_hat * mean(dy * x_hat)). Like PyTorch, the backward
keeps only the input x and the two per-channel vectors alive, not x - mean, x_hat or y.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .fused_ops import fused_call

FORWARD = "batch_norm_train"
BACKWARD = "batch_norm_train_backward"


def batch_norm_train(bb, x, w, b, running_mean, running_var, momentum: float, eps: float):
    """Emit the fused op; return (y, save_mean, save_rstd, new_running_mean, new_running_var).

    `w` or `b` None (affine=False) become constant ones and zeros."""
    channels = int(x.ty.shape[1])
    if w is None:
        w = relax.const(np.ones(channels, "float32"))
    if b is None:
        b = relax.const(np.zeros(channels, "float32"))
    vec = relax.TensorType((channels,), str(x.ty.dtype))
    out = bb.emit(fused_call(FORWARD, [x, w, b, running_mean, running_var],
                             [x.ty, vec, vec, vec, vec], momentum=float(momentum),
                             eps=float(eps)))
    return tuple(bb.emit(relax.TupleGetItem(out, i)) for i in range(5))


def batch_norm_train_grad(orig_var, tensors, output_grad, attrs):
    x, w, _, _, _ = tensors
    mean, rstd = relax.TupleGetItem(orig_var, 1), relax.TupleGetItem(orig_var, 2)
    dy = relax.TupleGetItem(output_grad, 0)  # the other outputs are statistics: no gradient
    grads = fused_call(BACKWARD, [x, w, mean, rstd, dy], [x.ty, w.ty, w.ty])
    dx, dw, db = (relax.TupleGetItem(grads, i) for i in range(3))
    return [dx, dw, db, None, None]
