"""Tensors made inside `forward` from constants: zeros, ones, full, empty, their `_like` and
`new_` forms, and arange.

The shape and dtype come from the traced result (`node.meta["val"]`), so they are PyTorch's
own, defaults included (`torch.full((2,), 2)` is int64). A filled tensor is a fill kernel
(no bytes in flash, arena only while it lives); arange's values are a constant computed by
torch itself. Neither has a gradient: Relax's rules give `full` none, and a constant is no
parameter. `empty` leaves its values undefined in PyTorch; here they are zeros (the fill
kernel goes when nothing reads the values, as `bernoulli_` reads only the shape).
"""

from __future__ import annotations

import torch
from tvm import relax
from tvm.relax import op as R

from .registry import aten, converts, torch_dtype_name


def _traced(node) -> torch.Tensor:
    return node.meta["val"]


def _fill(ctx, node, value):
    val = _traced(node)
    dtype = torch_dtype_name(val.dtype)
    return ctx.emit(R.full(tuple(val.shape), relax.const(value, dtype), dtype))


@converts(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default,
          aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default)
def _zeros(ctx, node, *args, **kwargs):
    return _fill(ctx, node, 0)


@converts(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(ctx, node, *args, **kwargs):
    return _fill(ctx, node, 1)


@converts(aten.full.default, aten.full_like.default, aten.new_full.default)
def _full(ctx, node, *args, **kwargs):
    return _fill(ctx, node, args[-1])  # full(size, v), full_like(x, v), new_full(x, size, v)


@converts(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(ctx, node, *args, **kwargs):
    """torch.arange itself, on the CPU, in the traced dtype: the same float steps."""
    values = torch.arange(*args, dtype=_traced(node).dtype).numpy()
    return relax.const(values, str(values.dtype))
