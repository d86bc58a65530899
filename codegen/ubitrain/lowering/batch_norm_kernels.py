"""TE kernels of the fused training-mode BatchNorm (training/batch_norm.py).

Channels are axis 1; every other axis (batch, then height and width for NCHW) is reduced.
Statistics and the backward's two sums accumulate in `acc` (float64 where the target has
a double-precision FPU, lowering/reductions.py); the variance takes two passes (mean,
then squared deviations around it), so a channel whose mean is large against its spread
keeps its variance. Elementwise work stays in the tensor's dtype, with the saved float32 mean and
rstd, as PyTorch's CPU kernels do.
"""

from __future__ import annotations

import math

from tvm import te, tirx


def _channel_sum(x_shape, body, acc: str, name: str):
    """Per-channel sum of `body(index)` over an x-shaped domain, accumulated in `acc`."""
    rvars = [te.reduce_axis((0, d), name=f"{name}_k{i}") for i, d in enumerate(x_shape)
             if i != 1]
    return te.compute((x_shape[1],), lambda c: te.sum(body([rvars[0], c] + rvars[1:]),
                                                      axis=rvars), name=name)


def batch_norm_stats(x, running_mean, running_var, momentum: float, eps: float, acc: str):
    """(save_mean, save_rstd, new_running_mean, new_running_var): the forward's reductions."""
    shape = [int(d) for d in x.shape]
    dtype = x.dtype
    count = math.prod(shape) // shape[1]
    n = tirx.const(count, acc)
    total = _channel_sum(shape, lambda i: x(*i).astype(acc), acc, "bn_sum")
    save_mean = te.compute(total.shape, lambda c: (total[c] / n).astype(dtype),
                           name="bn_save_mean")

    def squared_deviation(i):
        # around the saved float32 mean that normalises x: an output (a restrict parameter
        # in C, unlike a scratch buffer), so gcc vectorises this sum
        dev = x(*i).astype(acc) - save_mean[i[1]].astype(acc)
        return dev * dev

    sqdev = _channel_sum(shape, squared_deviation, acc, "bn_sqdev")
    var = te.compute(total.shape, lambda c: sqdev[c] / n, name="bn_var")
    save_rstd = te.compute(total.shape, lambda c: (tirx.const(1, acc) / tirx.sqrt(
        var[c] + tirx.const(eps, acc))).astype(dtype), name="bn_save_rstd")
    # PyTorch's running statistics: momentum-weighted, with the unbiased batch variance.
    keep = tirx.const(1.0 - momentum, dtype)
    new_mean = te.compute(total.shape, lambda c: running_mean[c] * keep
                          + save_mean[c] * tirx.const(momentum, dtype), name="bn_new_mean")
    unbiased = tirx.const(momentum * count / (count - 1), dtype)
    new_var = te.compute(total.shape, lambda c: running_var[c] * keep
                         + var[c].astype(dtype) * unbiased, name="bn_new_var")
    return save_mean, save_rstd, new_mean, new_var


def batch_norm_apply(x, save_mean, save_rstd, w, b):
    """y = x * alpha + beta, alpha = rstd * gamma, beta = beta - mean * alpha: a product and a
    sum an element, rounded as PyTorch's CPU forward rounds them
    (batch_norm_cpu_collect_linear_and_constant_terms); the per-channel terms are loop
    invariants the C compiler hoists. A broadcast kernel, so the activation after it fuses
    into it, and rebuilding y for a recomputation reads x once."""
    def y(*i):
        alpha = save_rstd[i[1]] * w[i[1]]
        return x(*i) * alpha + (b[i[1]] - save_mean[i[1]] * alpha)

    return te.compute(x.shape, y, name="bn_y")


def batch_norm_train_backward(x, w, save_mean, save_rstd, dy, acc: str):
    """(dx, dgamma, dbeta) from the input, gamma, the saved statistics and dy."""
    shape = [int(d) for d in x.shape]
    dtype = x.dtype
    n = tirx.const(math.prod(shape) // shape[1], acc)

    def x_hat(i):
        c = i[1]
        return (x(*i) - save_mean[c]) * save_rstd[c]

    sum_dy = _channel_sum(shape, lambda i: dy(*i).astype(acc), acc, "bn_sum_dy")
    sum_dy_xhat = _channel_sum(shape, lambda i: dy(*i).astype(acc) * x_hat(i).astype(acc),
                               acc, "bn_sum_dy_xhat")
    dbeta = te.compute(sum_dy.shape, lambda c: sum_dy[c].astype(dtype), name="bn_dbeta")
    dgamma = te.compute(sum_dy.shape, lambda c: sum_dy_xhat[c].astype(dtype), name="bn_dgamma")
    mean_dy = te.compute(sum_dy.shape, lambda c: (sum_dy[c] / n).astype(dtype),
                         name="bn_mean_dy")
    mean_dy_xhat = te.compute(sum_dy.shape, lambda c: (sum_dy_xhat[c] / n).astype(dtype),
                              name="bn_mean_dy_xhat")
    scale = te.compute(sum_dy.shape, lambda c: w[c] * save_rstd[c], name="bn_dx_scale")

    def grad_input(*i):
        c = i[1]
        return scale[c] * (dy(*i) - mean_dy[c] - x_hat(i) * mean_dy_xhat[c])

    dx = te.compute(shape, grad_input, name="bn_dx")
    return dx, dgamma, dbeta
