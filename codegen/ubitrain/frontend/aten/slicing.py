"""Cutting a tensor by constants: split (chunk), split_with_sizes, unbind, slice (narrow and
`x[:, 1:5:2]`), select (`x[:, 0]`), and roll (two slices joined the other way round).

Each part is its own tensor: `relax.split` and `relax.strided_slice` legalize into copy
kernels, never into views of the source (only `relax.reshape` is a view, program/build.py),
so nothing downstream has to prove a part contiguous. The gradients: TVM's for split (the
concat of the parts' gradients, zeros for an unused part), ubitrain's for strided_slice
(training/gradients.py).
"""

from __future__ import annotations

import itertools

from tvm import relax
from tvm.relax import op as R

from .layout import reshape_to
from .registry import aten, converts, shape_of, unsupported


def _split_sizes(ctx, x, sizes, dim):
    """`x` cut along `dim` into consecutive parts of `sizes`, as a tuple: one kernel."""
    if any(s <= 0 for s in sizes):
        unsupported(ctx, f"a split into empty parts (sizes {list(sizes)})",
                    "split into parts of at least one element")
    if len(sizes) == 1:
        return (x,)
    parts = ctx.emit(R.split(x, list(itertools.accumulate(sizes))[:-1], axis=dim))
    return tuple(ctx.emit(relax.TupleGetItem(parts, i)) for i in range(len(sizes)))


@converts(aten.split.Tensor)
def _split(ctx, node, x, size, dim=0):
    """`torch.split(x, size)` and `torch.chunk`: parts of `size`, the last one shorter."""
    dim = dim % len(shape_of(x))
    length = shape_of(x)[dim]
    return _split_sizes(ctx, x, [min(size, length - s) for s in range(0, length, size)], dim)


@converts(aten.split_with_sizes.default)
def _split_with_sizes(ctx, node, x, sizes, dim=0):
    return _split_sizes(ctx, x, list(sizes), dim % len(shape_of(x)))


def _drop_dim(ctx, x, dim):
    return reshape_to(ctx, x, [n for i, n in enumerate(shape_of(x)) if i != dim])


@converts(aten.unbind.int)
def _unbind(ctx, node, x, dim=0):
    dim = dim % len(shape_of(x))
    parts = _split_sizes(ctx, x, [1] * shape_of(x)[dim], dim)
    return tuple(_drop_dim(ctx, p, dim) for p in parts)


@converts(aten.slice.Tensor)
def slice_(ctx, node, x, dim=0, start=None, end=None, step=1):
    """Python's slice rules (negative, clamped, an end of 2**63 - 1 for `::2`) are those of
    `range`, so a `range` says which elements remain."""
    dim = dim % len(shape_of(x))
    length = shape_of(x)[dim]
    kept = range(length)[slice(start, end, step)]
    if len(kept) == 0:
        unsupported(ctx, f"a slice [{start}:{end}:{step}] that keeps nothing of {length}",
                    "keep at least one element")
    if len(kept) == length:  # step 1 over everything: the tensor itself
        return x
    # end just past the last element kept, so that it never lies outside the axis
    return ctx.emit(R.strided_slice(x, [dim], [kept[0]], [kept[-1] + 1], [kept.step]))


@converts(aten.select.int)
def _select(ctx, node, x, dim, index):
    dim = dim % len(shape_of(x))
    index = range(shape_of(x)[dim])[index]  # a negative index counts from the end
    return _drop_dim(ctx, slice_(ctx, node, x, dim, index, index + 1), dim)


@converts(aten.roll.default)
def _roll(ctx, node, x, shifts, dims=()):
    """`torch.roll`: per dim, the last `shift` elements moved to the front by one concat of
    two slices (the gradient rolls back through them)."""
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if len(dims) != len(shifts):
        unsupported(ctx, "roll without a dim per shift (over the flattened tensor)",
                    "give dims, one per shift")
    for shift, dim in zip(shifts, dims):
        dim = dim % len(shape_of(x))
        n = shape_of(x)[dim]
        cut = n - shift % n
        if cut != n:
            x = ctx.emit(R.concat([slice_(ctx, node, x, dim, cut, n),
                                   slice_(ctx, node, x, dim, 0, cut)], axis=dim))
    return x
