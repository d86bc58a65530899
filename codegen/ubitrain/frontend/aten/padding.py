"""`F.pad` (and `nn.ZeroPad2d`, `ConstantPad*`, `ReflectionPad*`, `ReplicationPad*`,
`CircularPad*`) in its four modes, one axis at a time: the border parts are slices of the
input (flipped for reflect, broadcast from the edge for replicate, from the far end for
circular) or fills (constant), joined to the input by one concat. Every piece is an op with a
gradient (strided_slice and flip: training/gradients.py; broadcast_to and concat: Relax's),
so the backward adds each border's gradient into the elements it copied, as PyTorch's does.
Negative constant pads crop, as in PyTorch.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax import op as R

from .registry import aten, converts, dtype_of, shape_of, unsupported
from .slicing import slice_

MODES = ("constant", "reflect", "replicate", "circular")


def _part(ctx, x, dim, start, end):
    """Elements [start, end) of `x` along `dim` (x itself when that is all of it)."""
    return slice_(ctx, None, x, dim, start, end)


def _border(ctx, x, dim, width, mode, value, leading):
    """The `width` elements that go before (`leading`) or after `x` along `dim`."""
    n = shape_of(x)[dim]
    if mode == "constant":
        shape = list(shape_of(x))
        shape[dim] = width
        return ctx.emit(R.full(shape, relax.const(value, dtype_of(x)), dtype_of(x)))
    if mode == "reflect":  # the mirror image without the edge element itself
        part = _part(ctx, x, dim, 1, width + 1) if leading else \
            _part(ctx, x, dim, n - 1 - width, n - 1)
        return ctx.emit(R.flip(part, dim))
    if mode == "replicate":
        edge = _part(ctx, x, dim, 0, 1) if leading else _part(ctx, x, dim, n - 1, n)
        shape = list(shape_of(x))
        shape[dim] = width
        return ctx.emit(R.broadcast_to(edge, shape))
    return _part(ctx, x, dim, n - width, n) if leading else _part(ctx, x, dim, 0, width)


def _pad_axis(ctx, x, dim, before, after, mode, value):
    n = shape_of(x)[dim]
    if mode == "constant" and min(before, after) < 0:
        if n + min(before, 0) + min(after, 0) <= 0:
            unsupported(ctx, f"pad ({before}, {after}) that crops all {n} elements of dim "
                        f"{dim}", "keep at least one element")
        x = _part(ctx, x, dim, max(-before, 0), n - max(-after, 0))
        before, after = max(before, 0), max(after, 0)
    elif min(before, after) < 0:
        unsupported(ctx, f"pad mode {mode!r} with a negative pad ({before}, {after})",
                    "crop with a slice first, or pad in mode 'constant'")
    limit = n - 1 if mode == "reflect" else n
    if mode in ("reflect", "circular") and max(before, after) > limit:
        unsupported(ctx, f"pad mode {mode!r} of ({before}, {after}) over dim {dim} of size {n}",
                    f"pad by at most {limit}")
    parts = ([_border(ctx, x, dim, before, mode, value, True)] if before else []) + [x] + \
        ([_border(ctx, x, dim, after, mode, value, False)] if after else [])
    return x if len(parts) == 1 else ctx.emit(R.concat(parts, axis=dim))


@converts(aten.pad.default)
def pad(ctx, node, x, widths, mode="constant", value=None):
    """`widths` lists (before, after) pairs from the last dim backwards, as PyTorch's does."""
    if mode not in MODES:
        unsupported(ctx, f"pad mode {mode!r}", f"use one of {', '.join(MODES)}")
    rank = len(shape_of(x))
    if len(widths) % 2 or len(widths) // 2 > rank:
        unsupported(ctx, f"pad {list(widths)} over a {rank}-D tensor",
                    "give one (before, after) pair per padded dim, last dim first")
    for i in range(len(widths) // 2):
        x = _pad_axis(ctx, x, rank - 1 - i, int(widths[2 * i]), int(widths[2 * i + 1]), mode,
                      float(value or 0.0))
    return x


@converts(aten.constant_pad_nd.default)
def _constant_pad_nd(ctx, node, x, widths, value=0):
    return pad(ctx, node, x, widths, "constant", value)
