"""Elementwise arithmetic with broadcasting; Python scalars become constants."""

from __future__ import annotations

from tvm import relax
from tvm.relax import op as R

from .registry import aten, cast, converts, dtype_of, result_dtype


def _binary(fn):
    def convert(ctx, node, a, b, alpha=1):
        dtype = result_dtype(node, a, b)
        a, b = cast(ctx, a, dtype), cast(ctx, b, dtype)
        if alpha != 1:
            b = ctx.emit(R.multiply(b, relax.const(alpha, dtype_of(b))))
        return ctx.emit(fn(a, b))
    return convert


converts(aten.add.Tensor, aten.add.Scalar)(_binary(R.add))
converts(aten.sub.Tensor, aten.sub.Scalar)(_binary(R.subtract))
converts(aten.mul.Tensor, aten.mul.Scalar)(_binary(R.multiply))
converts(aten.div.Tensor, aten.div.Scalar)(_binary(R.divide))


@converts(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, node, a, b, alpha=1):
    """`rsub(a, b, alpha) = b - alpha * a` (what `2.0 - x` exports to)."""
    return _binary(R.subtract)(ctx, node, b, a, alpha)


@converts(aten.neg.default)
def neg(ctx, node, x):
    return ctx.emit(R.negative(x))
