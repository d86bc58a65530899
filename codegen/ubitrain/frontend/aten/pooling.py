"""Pooling and reductions."""

from __future__ import annotations

from tvm.relax import op as R

from ...ops.adaptive_pool import adaptive_pool2d
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


def _batched(ctx, x, rank, pool):
    """`pool` of an [N, C, ...] tensor of `rank` dimensions, applied to x of that rank or an
    unbatched one (a batch of one); `pool` returns an emitted value."""
    shape = shape_of(x)
    if len(shape) == rank:
        return pool(x)
    y = pool(ctx.emit(R.reshape(x, (1, *shape))))
    return ctx.emit(R.reshape(y, shape_of(y)[1:]))


def _pool1d(ctx, x, pool2d):
    """A 1-D pool is a 2-D pool over a height of one (as Conv1d is a Conv2d): [N, C, L] (or an
    unbatched [C, L]) as [N, C, 1, L]. Its gradient is then the 2-D pool's."""
    def pool(x3):
        n, c, length = shape_of(x3)
        y = pool2d(ctx.emit(R.reshape(x3, (n, c, 1, length))))
        return ctx.emit(R.reshape(y, (n, c, shape_of(y)[-1])))
    return _batched(ctx, x, 3, pool)


def _one(v) -> int:
    return pair(v, 1)[0]


@converts(aten.max_pool1d.default)
def _max_pool1d(ctx, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _one(kernel), _one(stride or kernel), _one(padding), _one(dilation)
    return _pool1d(ctx, x, lambda x4: ctx.emit(R.nn.max_pool2d(
        x4, [1, k], [1, s], [0, p, 0, p], [1, d], ceil_mode=ceil_mode)))


@converts(aten.avg_pool1d.default)
def _avg_pool1d(ctx, node, x, kernel, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True):
    k, s, p = _one(kernel), _one(stride or kernel), _one(padding)
    return _pool1d(ctx, x, lambda x4: ctx.emit(R.nn.avg_pool2d(
        x4, [1, k], [1, s], [0, p, 0, p], ceil_mode=ceil_mode,
        count_include_pad=count_include_pad)))


def _even_windows(size: int, out: int):
    """(kernel, stride) when PyTorch's adaptive windows along an axis, [floor(i * size / out),
    ceil((i + 1) * size / out)), are those of a plain pool (always where out divides size,
    and sometimes otherwise: 7 -> 3 is kernel 3, stride 2); else None."""
    starts = [i * size // out for i in range(out)]
    sizes = {-(-(i + 1) * size // out) - start for i, start in enumerate(starts)}
    steps = {b - a for a, b in zip(starts, starts[1:])} or {size}
    if len(sizes) == 1 and len(steps) == 1 and min(steps) > 0:
        return sizes.pop(), steps.pop()
    return None


def _adaptive_pool2d(ctx, x4, out, mode):
    """PyTorch's adaptive pool of NCHW x4 to `out` (OH, OW): a plain pool where the windows are
    even (the global average: a mean), else ubitrain's fused op for uneven or repeated ones."""
    size = shape_of(x4)[2:]
    out = [d if o is None else int(o) for o, d in zip(out, size)]  # None: keep that size
    if mode == "avg" and out == [1, 1]:
        return ctx.emit(R.mean(x4, axis=[2, 3], keepdims=True))
    even = [_even_windows(d, o) for d, o in zip(size, out)]
    if None in even:
        return adaptive_pool2d(ctx.bb, x4, out, mode)
    (kh, sh), (kw, sw) = even
    pool = R.nn.avg_pool2d if mode == "avg" else R.nn.max_pool2d
    return ctx.emit(pool(x4, [kh, kw], [sh, sw], [0, 0, 0, 0]))


def _no_indices(ctx, node, what):
    """Adaptive max pools return (values, indices); ubitrain computes the values only."""
    if any(user.args[1:] != (0,) for user in node.users):
        unsupported(ctx, f"{what} indices (return_indices=True)", "use the pooled values only")


@converts(aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx, node, x, output_size):
    return _batched(ctx, x, 4, lambda x4: _adaptive_pool2d(ctx, x4, pair(output_size), "avg"))


@converts(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool2d(ctx, node, x, output_size):
    _no_indices(ctx, node, "AdaptiveMaxPool2d")
    y = _batched(ctx, x, 4, lambda x4: _adaptive_pool2d(ctx, x4, pair(output_size), "max"))
    return (y, None)


@converts(aten.adaptive_avg_pool1d.default)
def _adaptive_avg_pool1d(ctx, node, x, output_size):
    return _pool1d(ctx, x, lambda x4: _adaptive_pool2d(ctx, x4, [1, _one(output_size)], "avg"))


@converts(aten.adaptive_max_pool1d.default)
def _adaptive_max_pool1d(ctx, node, x, output_size):
    _no_indices(ctx, node, "AdaptiveMaxPool1d")
    return (_pool1d(ctx, x, lambda x4: _adaptive_pool2d(ctx, x4, [1, _one(output_size)],
                                                        "max")), None)


@converts(aten.mean.dim, aten.mean.default)
def mean(ctx, node, x, dims=None, keepdim=False, dtype=None):
    return ctx.emit(R.mean(x, axis=axes(dims, len(shape_of(x))), keepdims=keepdim))


@converts(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, node, x, dims=None, keepdim=False, dtype=None):
    return ctx.emit(R.sum(x, axis=axes(dims, len(shape_of(x))), keepdims=keepdim))
