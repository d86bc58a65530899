"""BatchNorm (training: batch statistics and new running statistics; eval) and LayerNorm."""

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
