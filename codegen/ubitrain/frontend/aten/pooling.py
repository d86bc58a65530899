"""Pooling and reductions."""

from __future__ import annotations

from tvm.relax import op as R

from .registry import aten, axes, converts, pair, shape_of, unsupported


@converts(aten.max_pool2d.default)
def _max_pool2d(ctx, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    ph, pw = pair(padding)
    return ctx.emit(R.nn.max_pool2d(x, pair(kernel), pair(stride or kernel), [ph, pw, ph, pw],
                                    pair(dilation), ceil_mode=ceil_mode))


@converts(aten.avg_pool2d.default)
def _avg_pool2d(ctx, node, x, kernel, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        unsupported(ctx, "AvgPool2d divisor_override", "leave divisor_override unset")
    ph, pw = pair(padding)
    return ctx.emit(R.nn.avg_pool2d(x, pair(kernel), pair(stride or kernel), [ph, pw, ph, pw],
                                    ceil_mode=ceil_mode, count_include_pad=count_include_pad))


def _pool1d(ctx, x, pool2d):
    """A 1-D pool is a 2-D pool over a height of one (as Conv1d is a Conv2d): [N, C, L], or
    an unbatched [C, L], as [N, C, 1, L]. Its gradient is then the 2-D pool's."""
    shape = shape_of(x)
    lead = (1,) * (3 - len(shape)) + shape[:-1]
    y = ctx.emit(pool2d(ctx.emit(R.reshape(x, (*lead, 1, shape[-1])))))
    return ctx.emit(R.reshape(y, (*shape[:-1], shape_of(y)[-1])))


def _one(v) -> int:
    return pair(v, 1)[0]


@converts(aten.max_pool1d.default)
def _max_pool1d(ctx, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _one(kernel), _one(stride or kernel), _one(padding), _one(dilation)
    return _pool1d(ctx, x, lambda x4: R.nn.max_pool2d(x4, [1, k], [1, s], [0, p, 0, p], [1, d],
                                                     ceil_mode=ceil_mode))


@converts(aten.avg_pool1d.default)
def _avg_pool1d(ctx, node, x, kernel, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True):
    k, s, p = _one(kernel), _one(stride or kernel), _one(padding)
    return _pool1d(ctx, x, lambda x4: R.nn.avg_pool2d(x4, [1, k], [1, s], [0, p, 0, p],
                                                     ceil_mode=ceil_mode,
                                                     count_include_pad=count_include_pad))


@converts(aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx, node, x, output_size):
    if tuple(pair(output_size)) != (1, 1):
        unsupported(ctx, f"AdaptiveAvgPool2d({output_size})",
                    "AdaptiveAvgPool2d(1) (global average pooling) is supported")
    return ctx.emit(R.mean(x, axis=[2, 3], keepdims=True))


@converts(aten.mean.dim, aten.mean.default)
def mean(ctx, node, x, dims=None, keepdim=False, dtype=None):
    return ctx.emit(R.mean(x, axis=axes(dims, len(shape_of(x))), keepdims=keepdim))


@converts(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, node, x, dims=None, keepdim=False, dtype=None):
    return ctx.emit(R.sum(x, axis=axes(dims, len(shape_of(x))), keepdims=keepdim))
