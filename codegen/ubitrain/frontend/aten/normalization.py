"""BatchNorm (training: batch statistics and new running statistics; eval), LayerNorm and
GroupNorm (a LayerNorm over each group's elements, then the per-channel affine)."""

from __future__ import annotations

import math

from tvm.relax import op as R

from ...ops.batch_norm import batch_norm_train
from ...ops.layer_norm import layer_norm
from .registry import as_expr, aten, converts, shape_of, unsupported


def _normalize(ctx, x, mean, var, eps):
    centered = ctx.emit(R.subtract(x, mean))
    std = ctx.emit(R.sqrt(ctx.emit(R.add(var, as_expr(eps, x)))))
    return ctx.emit(R.divide(centered, std))


def _channel(ctx, v, rank):
    return ctx.emit(R.reshape(v, (1, shape_of(v)[0]) + (1,) * (rank - 2)))


def _affine(ctx, y, w, b, reshape):
    if w is not None:
        y = ctx.emit(R.multiply(y, reshape(w)))
    if b is not None:
        y = ctx.emit(R.add(y, reshape(b)))
    return y


@converts(aten._native_batch_norm_legit_functional.default)
def batch_norm_training(ctx, node, x, w, b, running_mean, running_var, training, momentum, eps):
    """One fused op, one kernel each way (training/batch_norm.py). aten's outputs: y, the
    batch mean and inverse std, the new running mean and variance."""
    if math.prod(shape_of(x)) // shape_of(x)[1] < 2:
        unsupported(ctx, "BatchNorm in training mode over a single value per channel",
                    "use a batch with more than one value per channel")
    return batch_norm_train(ctx.bb, x, w, b, running_mean, running_var, momentum, eps)


@converts(aten._native_batch_norm_legit_no_training.default)
def batch_norm_eval(ctx, node, x, w, b, running_mean, running_var, momentum, eps):
    rank = len(shape_of(x))
    mean, var = _channel(ctx, running_mean, rank), _channel(ctx, running_var, rank)
    y = _affine(ctx, _normalize(ctx, x, mean, var, eps), w, b, lambda v: _channel(ctx, v, rank))
    return (y, mean, var)


@converts(aten.layer_norm.default)
def layer_norm_op(ctx, node, x, normalized_shape, w=None, b=None, eps=1e-5, cudnn_enable=False):
    """One fused op, one kernel each way (training/layer_norm.py)."""
    if len(normalized_shape) >= len(shape_of(x)):
        unsupported(ctx, f"LayerNorm over every dimension of a {len(shape_of(x))}-d input",
                    "normalize the trailing dimensions of an input with a batch dimension")
    return layer_norm(ctx.bb, x, w, b, len(normalized_shape), eps)


@converts(aten.group_norm.default)
def group_norm_op(ctx, node, x, num_groups, w=None, b=None, eps=1e-5, cudnn_enabled=False):
    """PyTorch's GroupNorm: each sample's channels in `num_groups` groups, each group
    normalized over its channels and positions (biased variance), then gamma and beta per
    channel. The normalization is the fused LayerNorm (its kernels, its backward keeping x
    and the per-row statistics) over x viewed as [N, groups, C / groups * positions]."""
    shape = shape_of(x)
    if len(shape) < 2 or shape[1] % num_groups:
        unsupported(ctx, f"GroupNorm of {num_groups} groups on an input of shape {shape}",
                    "an input [N, C, ...] with C divisible by num_groups")
    rows = ctx.emit(R.reshape(x, (shape[0], num_groups, math.prod(shape[1:]) // num_groups)))
    y = ctx.emit(R.reshape(layer_norm(ctx.bb, rows, None, None, 1, eps), shape))
    return _affine(ctx, y, w, b, lambda v: _channel(ctx, v, len(shape)))
