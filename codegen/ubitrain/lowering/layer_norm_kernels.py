"""TE kernels of the fused LayerNorm (training/layer_norm.py).

A row is one index of the leading dimensions; the last `axes` dimensions are normalized.
Row statistics and the backward's row sums accumulate in `acc` (float64 where the target
has a double-precision FPU, lowering/reductions.py), the variance in two passes as for
BatchNorm; the weight and bias gradients sum over rows in `acc` too. Elementwise work stays
in the tensor's dtype with the saved float32 mean and rstd, as PyTorch's CPU kernel does.
"""

from __future__ import annotations

import math

from tvm import te, tirx


def _split(shape, axes: int):
    lead = len(shape) - axes
    return shape[:lead], shape[lead:]


def _row_sum(x_shape, axes: int, body, acc: str, name: str):
    """Per row: the sum of `body(index)` over the normalized dimensions, in `acc`."""
    rows, normalized = _split(x_shape, axes)
    k = [te.reduce_axis((0, d), name=f"{name}_k{i}") for i, d in enumerate(normalized)]
    return te.compute(rows, lambda *r: te.sum(body(list(r) + k), axis=k), name=name)


def _column_sum(x_shape, axes: int, body, acc: str, name: str):
    """Per normalized element: the sum of `body(index)` over all rows, in `acc`."""
    rows, normalized = _split(x_shape, axes)
    k = [te.reduce_axis((0, d), name=f"{name}_k{i}") for i, d in enumerate(rows)]
    return te.compute(normalized, lambda *c: te.sum(body(k + list(c)), axis=k), name=name)


def layer_norm(x, w, b, axes: int, eps: float, acc: str):
    """(y, save_mean, save_rstd)."""
    shape = [int(d) for d in x.shape]
    lead = len(shape) - axes
    dtype = x.dtype
    n = tirx.const(math.prod(shape[lead:]), acc)
    total = _row_sum(shape, axes, lambda i: x(*i).astype(acc), acc, "ln_sum")
    mean = te.compute(total.shape, lambda *r: total(*r) / n, name="ln_mean")

    def squared_deviation(i):
        dev = x(*i).astype(acc) - mean(*i[:lead])
        return dev * dev

    sqdev = _row_sum(shape, axes, squared_deviation, acc, "ln_sqdev")
    save_mean = te.compute(total.shape, lambda *r: mean(*r).astype(dtype), name="ln_save_mean")
    save_rstd = te.compute(total.shape, lambda *r: (tirx.const(1, acc) / tirx.sqrt(
        sqdev(*r) / n + tirx.const(eps, acc))).astype(dtype), name="ln_save_rstd")

    def normalize(*i):
        r, c = i[:lead], i[lead:]
        return (x(*i) - save_mean(*r)) * save_rstd(*r) * w(*c) + b(*c)

    return te.compute(shape, normalize, name="ln_y"), save_mean, save_rstd


def _input_gradient(x, w, save_mean, save_rstd, dy, axes: int, acc: str):
    """(dx, x_hat) of the backward: x_hat(index) for the weight gradients."""
    shape = [int(d) for d in x.shape]
    lead = len(shape) - axes
    dtype = x.dtype
    n = tirx.const(math.prod(shape[lead:]), acc)

    def x_hat(i):
        return (x(*i) - save_mean(*i[:lead])) * save_rstd(*i[:lead])

    def g(i):
        return dy(*i) * w(*i[lead:])

    sum_g = _row_sum(shape, axes, lambda i: g(i).astype(acc), acc, "ln_sum_g")
    sum_g_xhat = _row_sum(shape, axes, lambda i: g(i).astype(acc) * x_hat(i).astype(acc),
                          acc, "ln_sum_g_xhat")
    mean_g = te.compute(sum_g.shape, lambda *r: (sum_g(*r) / n).astype(dtype),
                        name="ln_mean_g")
    mean_g_xhat = te.compute(sum_g.shape, lambda *r: (sum_g_xhat(*r) / n).astype(dtype),
                             name="ln_mean_g_xhat")

    def grad_input(*i):
        r = i[:lead]
        return save_rstd(*r) * (g(i) - mean_g(*r) - x_hat(i) * mean_g_xhat(*r))

    return te.compute(shape, grad_input, name="ln_dx"), x_hat


def layer_norm_backward(x, w, save_mean, save_rstd, dy, axes: int, acc: str):
    """(dx, dgamma, dbeta) from the input, gamma, the saved row statistics and dy."""
    shape = [int(d) for d in x.shape]
    dtype = x.dtype
    dx, x_hat = _input_gradient(x, w, save_mean, save_rstd, dy, axes, acc)
    sum_dy_xhat = _column_sum(shape, axes, lambda i: dy(*i).astype(acc) * x_hat(i).astype(acc),
                              acc, "ln_sum_dy_xhat")
    sum_dy = _column_sum(shape, axes, lambda i: dy(*i).astype(acc), acc, "ln_sum_dy")
    dgamma = te.compute(w.shape, lambda *c: sum_dy_xhat(*c).astype(dtype), name="ln_dgamma")
    dbeta = te.compute(w.shape, lambda *c: sum_dy(*c).astype(dtype), name="ln_dbeta")
    return dx, dgamma, dbeta


def layer_norm_input_backward(x, w, save_mean, save_rstd, dy, axes: int, acc: str):
    """dx alone, for a LayerNorm whose gamma and beta are frozen (fine-tuning with LoRA):
    the two column sums over every row, and their buffers, are not computed."""
    return _input_gradient(x, w, save_mean, save_rstd, dy, axes, acc)[0]
