"""Activations. Their gradients: training/gradients.py (PyTorch's choice at each kink)."""

from __future__ import annotations

import torch
from tvm.relax import op as R

from ...ops.elu import elu
from .registry import as_expr, aten, converts, dtype_of, shape_of, unsupported


@converts(aten.relu.default)
def relu(ctx, node, x):
    return ctx.emit(R.nn.relu(x))


@converts(aten.hardtanh.default)
def _hardtanh(ctx, node, x, min_val=-1.0, max_val=1.0):
    return ctx.emit(R.clip(x, float(min_val), float(max_val)))


@converts(aten.relu6.default)
def _relu6(ctx, node, x):
    return ctx.emit(R.clip(x, 0.0, 6.0))


@converts(aten.sigmoid.default)
def sigmoid(ctx, node, x):
    return ctx.emit(R.sigmoid(x))


@converts(aten.tanh.default)
def tanh(ctx, node, x):
    return ctx.emit(R.tanh(x))


@converts(aten.silu.default)
def _silu(ctx, node, x):
    return ctx.emit(R.nn.silu(x))


@converts(aten.hardswish.default)
def hardswish(ctx, node, x):
    gate = ctx.emit(R.clip(ctx.emit(R.add(x, as_expr(3.0, x))), 0.0, 6.0))
    return ctx.emit(R.divide(ctx.emit(R.multiply(x, gate)), as_expr(6.0, x)))


@converts(aten.gelu.default)
def gelu(ctx, node, x, approximate="none"):
    # One op each, so that the backward (training/gradients.py) keeps only x alive.
    if approximate == "tanh":
        return ctx.emit(R.nn.gelu_tanh(x))
    if approximate == "none":
        return ctx.emit(R.nn.gelu(x))
    unsupported(ctx, f"GELU approximate={approximate!r}", "use 'none' or 'tanh'")


@converts(aten.hardsigmoid.default)
def hardsigmoid(ctx, node, x):
    # PyTorch computes clip(x + 3, 0, 6) / 6; clipping x itself to [-3, 3] gives the same
    # values, and clip's gradient (training/gradients.py) is then PyTorch's exact rule, 1/6
    # where -3 < x < 3, with no rounding of x + 3 moving an element across a bound.
    inside = ctx.emit(R.clip(x, -3.0, 3.0))
    return ctx.emit(R.add(ctx.emit(R.divide(inside, as_expr(6.0, x))), as_expr(0.5, x)))


@converts(aten.leaky_relu.default)
def leaky_relu(ctx, node, x, negative_slope=0.01):
    # x > 0 ? x : x * slope, as PyTorch; the gradient is in training/gradients.py.
    return ctx.emit(R.nn.leakyrelu(x, float(negative_slope)))


@converts(aten.elu.default)
def _elu(ctx, node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    # One fused op each way (training/elu.py): exact expm1, PyTorch's gradient from x alone.
    return ctx.emit(elu(x, alpha, scale, input_scale))


# PyTorch's SELU and CELU are its ELU kernel with these coefficients (at::selu, at::celu).
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@converts(aten.selu.default)
def _selu(ctx, node, x):
    return ctx.emit(elu(x, SELU_ALPHA, SELU_SCALE, 1.0))


@converts(aten.celu.default)
def _celu(ctx, node, x, alpha=1.0):
    return ctx.emit(elu(x, alpha, 1.0, 1.0 / float(alpha)))



def _softmax_axis(ctx, name, x, dim, dtype):
    if dtype is not None and dtype != getattr(torch, dtype_of(x)):
        unsupported(ctx, f"{name} with dtype={dtype}", f"use {name} in the input's dtype")
    return int(dim) % len(shape_of(x))


# Relax's kernels subtract each row's maximum before exp, and its gradients are PyTorch's,
# y * (dy - sum(dy * y)) and dy - exp(y) * sum(dy), from the output alone.
@converts(aten.softmax.int)
def softmax(ctx, node, x, dim, dtype=None):
    return ctx.emit(R.nn.softmax(x, _softmax_axis(ctx, "softmax", x, dim, dtype)))


@converts(aten.log_softmax.int)
def log_softmax(ctx, node, x, dim, dtype=None):
    return ctx.emit(R.nn.log_softmax(x, _softmax_axis(ctx, "log_softmax", x, dim, dtype)))


# What softmax.int decomposes to; half_to_float only concerns float16 on CUDA.
@converts(aten._softmax.default)
def _softmax(ctx, node, x, dim, half_to_float=False):
    return softmax(ctx, node, x, dim)


@converts(aten._log_softmax.default)
def _log_softmax(ctx, node, x, dim, half_to_float=False):
    return log_softmax(ctx, node, x, dim)
