"""Elementwise math: exp, log, sqrt, rsqrt, reciprocal, abs, pow, clamp, sin and cos.

Their gradients are Relax's (exp, log, sqrt, power, sin, cos), compositions of ops that have one
(rsqrt, reciprocal, clamp), or ubitrain's where PyTorch's rule differs at a point
(abs: training/gradients.py).
"""

from __future__ import annotations

from tvm import relax
from tvm.relax import op as R

from .registry import as_expr, aten, converts, dtype_of, unsupported


@converts(aten.exp.default)
def exp(ctx, node, x):
    return ctx.emit(R.exp(x))


@converts(aten.log.default)
def log(ctx, node, x):
    return ctx.emit(R.log(x))


@converts(aten.sin.default)
def sin(ctx, node, x):  # rotary position embeddings (Llama) take the sine of angles
    return ctx.emit(R.sin(x))


@converts(aten.cos.default)
def cos(ctx, node, x):
    return ctx.emit(R.cos(x))


@converts(aten._weight_norm.default)
def _weight_norm(ctx, node, v, g, dim=0):
    """`nn.utils.weight_norm` (a parametrization): w = v * (g / ||v||), the L2 norm over
    every dimension but `dim` (over all of v for dim=-1), by ops with Relax gradients."""
    rank = len(v.ty.shape)
    over = list(range(rank)) if dim == -1 else [d for d in range(rank) if d != dim % rank]
    norm = ctx.emit(R.sqrt(ctx.emit(R.sum(ctx.emit(R.multiply(v, v)), over, keepdims=True))))
    return ctx.emit(R.multiply(v, ctx.emit(R.divide(g, norm))))


@converts(aten.sqrt.default)
def _sqrt(ctx, node, x):
    return ctx.emit(R.sqrt(x))


@converts(aten.rsqrt.default)
def _rsqrt(ctx, node, x):
    return ctx.emit(R.divide(as_expr(1.0, x), ctx.emit(R.sqrt(x))))


@converts(aten.reciprocal.default)
def reciprocal(ctx, node, x):
    return ctx.emit(R.divide(as_expr(1.0, x), x))


@converts(aten.abs.default)
def abs_(ctx, node, x):
    return ctx.emit(R.abs(x))


@converts(aten.pow.Tensor_Scalar)
def pow_scalar(ctx, node, x, exponent):
    if exponent == 2:  # PyTorch squares by one multiply; so does the gradient, 2 * x exactly
        return ctx.emit(R.multiply(x, x))
    return ctx.emit(R.power(x, as_expr(float(exponent), x)))


@converts(aten.pow.Scalar)
def _scalar_pow(ctx, node, base, x):
    if float(base) <= 0:
        unsupported(ctx, f"pow({base}, tensor)", "use a positive base (its gradient is "
                    "base ** x * log(base))")
    return ctx.emit(R.power(as_expr(float(base), x), x))


@converts(aten.clamp.default, aten.clip.default)
def clamp(ctx, node, x, min=None, max=None):  # noqa: A002 - PyTorch's names
    """PyTorch's clamp: max(x, lo), then min(., hi) (so hi wins when lo > hi), NaN kept;
    the gradient passes where lo <= x <= hi, bounds included (unlike Hardtanh's, which
    `relax.clip` carries). Two selects on x give both: the gradient of `where` passes
    exactly where neither bound was chosen."""
    lo, hi = min, max  # numbers: tensor bounds are aten.clamp.Tensor, not converted
    if lo is not None and hi is not None and lo > hi:
        return ctx.emit(R.full_like(x, relax.const(float(hi), dtype_of(x))))
    if lo is not None:
        x = ctx.emit(R.where(R.less(x, as_expr(float(lo), x)), as_expr(float(lo), x), x))
    if hi is not None:
        x = ctx.emit(R.where(R.greater(x, as_expr(float(hi), x)), as_expr(float(hi), x), x))
    return x


@converts(aten.clamp_min.default)
def _clamp_min(ctx, node, x, min):  # noqa: A002
    return clamp(ctx, node, x, min=min)


@converts(aten.clamp_max.default)
def _clamp_max(ctx, node, x, max):  # noqa: A002
    return clamp(ctx, node, x, max=max)
