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
