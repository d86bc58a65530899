"""Boolean masks from a model input: a padding `attention_mask` (int64 0/1 per token) made a
bool tensor and combined with a constant mask, as Hugging Face models do before attention
(`mask.to(torch.bool)`, `causal & padding`).

Only what such a mask needs: dtype conversions (to bool is `!= 0`, as PyTorch's; to a float
for an additive mask) and the logical ops on bool tensors. A mask carries no gradient. A
comparison of float data (`x > 0.5`) stays refused: it would decide a gradient's path.
"""

from __future__ import annotations

import torch
from tvm import relax
from tvm.relax import op as R

from .registry import aten, converts, dtype_of, torch_dtype_name, unsupported


@converts(aten._to_copy.default)
def _to_copy(ctx, node, x, *, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    """`x.to(dtype)` (a copy; its device and layout are the CPU's strided ones)."""
    if dtype is None or torch_dtype_name(dtype) == dtype_of(x):
        return x  # a copy of a value nothing writes in place: the value itself
    to = torch_dtype_name(dtype)
    if dtype == torch.bool:
        return ctx.emit(R.not_equal(x, relax.const(0, dtype_of(x))))
    if dtype_of(x) in ("bool", "int32", "int64") and dtype.is_floating_point:
        return ctx.emit(R.astype(x, to))
    unsupported(ctx, f"{dtype_of(x)} to {to} (aten._to_copy)",
                "convert to bool, or from bool or an integer to float32")


def _logical(op, what: str):
    def convert(ctx, node, a, b):
        if dtype_of(a) != "bool" or dtype_of(b) != "bool":
            unsupported(ctx, f"{what} of {dtype_of(a)} and {dtype_of(b)} tensors",
                        "combine bool masks only")
        return ctx.emit(op(a, b))
    return convert


converts(aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default)(
    _logical(R.logical_and, "and"))
converts(aten.__or__.Tensor, aten.bitwise_or.Tensor, aten.logical_or.default)(
    _logical(R.logical_or, "or"))


@converts(aten.logical_not.default, aten.bitwise_not.default)
def _not(ctx, node, x):
    if dtype_of(x) != "bool":
        unsupported(ctx, f"not of an {dtype_of(x)} tensor", "negate a bool mask only")
    return ctx.emit(R.logical_not(x))
