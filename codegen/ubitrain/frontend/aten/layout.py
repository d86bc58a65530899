"""Views, reshapes, transposes, expand and concatenation: data movement only."""

from __future__ import annotations

import math
import operator

from tvm.relax import op as R

from .registry import aten, converts, shape_of


def reshape_to(ctx, x, shape):
    shape = list(shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = math.prod(shape_of(x)) // known
    return ctx.emit(R.reshape(x, tuple(shape)))


@converts(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _view(ctx, node, x, shape):
    return reshape_to(ctx, x, shape)


@converts(aten.flatten.using_ints)
def _flatten(ctx, node, x, start=0, end=-1):
    shape = shape_of(x)
    start, end = start % len(shape), end % len(shape)
    return reshape_to(ctx, x, shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:])


@converts(aten.unsqueeze.default)
def _unsqueeze(ctx, node, x, dim):
    shape = list(shape_of(x))
    shape.insert(dim % (len(shape) + 1), 1)
    return reshape_to(ctx, x, shape)


@converts(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx, node, x, dims=None):
    shape = shape_of(x)
    if dims is None:  # x.squeeze(): every axis of size one
        dims = range(len(shape))
    dims = {d % len(shape) for d in ([dims] if isinstance(dims, int) else dims)}
    return reshape_to(ctx, x, [s for i, s in enumerate(shape) if not (i in dims and s == 1)])


@converts(aten.permute.default)
def _permute(ctx, node, x, dims):
    return ctx.emit(R.permute_dims(x, [d % len(shape_of(x)) for d in dims]))


@converts(aten.transpose.int)
def _transpose(ctx, node, x, d0, d1):
    axes = list(range(len(shape_of(x))))
    d0, d1 = d0 % len(axes), d1 % len(axes)
    axes[d0], axes[d1] = axes[d1], axes[d0]
    return ctx.emit(R.permute_dims(x, axes))


@converts(aten.t.default)
def _t(ctx, node, x):
    return ctx.emit(R.permute_dims(x, [1, 0])) if len(shape_of(x)) == 2 else x


@converts(aten.expand.default)
def _expand(ctx, node, x, shape, implicit=False):
    """`x.expand(...)`: -1 keeps a size. A copy, not a view (as every op here but reshape);
    the gradient sums over the broadcast axes (TVM's broadcast_to rule)."""
    own = (None,) * (len(shape) - len(shape_of(x))) + shape_of(x)
    target = tuple(o if s == -1 else int(s) for s, o in zip(shape, own))
    return x if target == shape_of(x) else ctx.emit(R.broadcast_to(x, target))


@converts(aten.flip.default)
def _flip(ctx, node, x, dims):
    """`x.flip(dims)`: one reversal per axis (what a bidirectional GRU/LSTM does to time)."""
    for dim in sorted({d % len(shape_of(x)) for d in dims}):
        x = ctx.emit(R.flip(x, dim))
    return x


@converts(aten.clone.default, aten.alias.default, aten.contiguous.default)
def _identity(ctx, node, x, *args, **kwargs):
    return x


@converts(aten.cat.default)
def cat(ctx, node, tensors, dim=0):
    # PyTorch skips a 1-D tensor of size 0 whatever the others' rank (an empty KV cache,
    # as GPT-2's attention concatenates with its keys)
    kept = [t for t in tensors if shape_of(t) != (0,)]
    tensors = kept or tensors[:1]
    if len(tensors) == 1:  # the tensor itself (TVM's concat gradient wants two parts)
        return tensors[0]
    return ctx.emit(R.concat(list(tensors), axis=dim % len(shape_of(tensors[0]))))


@converts(aten.stack.default)
def _stack(ctx, node, tensors, dim=0):
    """`torch.stack`: each tensor with a new axis of one at `dim`, concatenated there."""
    dim = dim % (len(shape_of(tensors[0])) + 1)
    return cat(ctx, node, [_unsqueeze(ctx, node, t, dim) for t in tensors], dim)


@converts(operator.getitem)
def _getitem(ctx, node, values, index):
    return values[index]
