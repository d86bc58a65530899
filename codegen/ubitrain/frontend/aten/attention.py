"""Scaled dot-product attention, as ops the compiler has: softmax(q k^T * scale + mask) v.

This is what PyTorch's math path computes (at::_scaled_dot_product_attention_math, which
splits the scale between q and k; here q is scaled, as nn.MultiheadAttention's own
need_weights=True path does): the scores are a batched matmul, the softmax is Relax's (it
subtracts each row's maximum before exp), and the gradients are those of matmul, multiply
and softmax, so no kernel of its own is needed.
`nn.MultiheadAttention(need_weights=False)` reaches this op too.

A mask known here, a constant (frontend/constants.py folds what is computed from constants,
shapes and the integer buffers the step never writes), is converted now: a boolean one (True:
attend) becomes an additive 0 / -inf constant, as PyTorch converts it, and a row that attends
to nothing gives zeros, as PyTorch's `_safe_softmax` does, where a plain softmax would give
NaN. A mask the step computes (a padding mask from a model input: `attention_mask`) is
converted by kernels in the step, the same way: its dead rows are found per step.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from ...ops.attention_mask import attention_mask
from .registry import aten, converts, dtype_of, shape_of, unsupported

_WORKS = ("attn_mask=None, a constant mask (a plain tensor attribute, or one computed from "
          "constants, shapes and integer buffers the step never writes), a boolean mask "
          "from a model input, or is_causal=True, dropout_p=0, enable_gqa=False")


def _additive_mask(ctx, mask, is_causal, rows, cols, dtype):
    """(additive mask or None, keep-row factor or None): numpy constants, or Relax
    expressions for a mask computed in the step."""
    if is_causal:  # PyTorch refuses an attn_mask with it while tracing
        mask = np.tril(np.ones((rows, cols), dtype=bool))
    elif mask is None:
        return None, None
    elif isinstance(mask, tvm.ir.Constant):
        mask = mask.value.numpy()
    else:
        return _run_time_mask(ctx, mask, dtype)
    if mask.dtype == bool:
        additive = np.where(mask, 0.0, -np.inf).astype(dtype)
    else:
        additive = mask.astype(dtype)
    # A row that is -inf throughout: PyTorch's safe softmax makes it zeros. Its additive
    # entries become 0 (finite scores, so no NaN) and the row's softmax is multiplied by 0.
    dead = np.all(additive == -np.inf, axis=-1, keepdims=True)
    if not dead.any():
        return additive, None
    additive = np.where(dead, 0.0, additive).astype(dtype)
    return additive, np.where(dead, 0.0, 1.0).astype(dtype)


def _expr(value, dtype):
    return value if isinstance(value, relax.Expr) else relax.const(value, dtype)


def _run_time_mask(ctx, mask, dtype):
    """(additive mask, keep-row factor) computed in the step from a boolean mask that a model
    input gives (True: attend). A float mask computed in the step could be a parameter's,
    whose gradient this does not give: refused."""
    if dtype_of(mask) != "bool":
        unsupported(ctx, f"scaled_dot_product_attention with a {dtype_of(mask)} attn_mask "
                    "computed at run time", f"use {_WORKS}")
    return attention_mask(ctx.bb, mask, dtype)


@converts(aten.scaled_dot_product_attention.default)
def scaled_dot_product_attention(ctx, node, q, k, v, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        unsupported(ctx, f"scaled_dot_product_attention with dropout_p={dropout_p} (a "
                    "dropout inside the op, not a Dropout layer)",
                    f"use {_WORKS}; nn.MultiheadAttention's dropout works with "
                    "need_weights=True, where it is a Dropout on the attention weights")
    if enable_gqa:
        unsupported(ctx, "scaled_dot_product_attention with enable_gqa=True",
                    f"repeat the key and value heads to the query's count; use {_WORKS}")
    dtype = dtype_of(q)
    rows, cols = shape_of(q)[-2], shape_of(k)[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(shape_of(q)[-1])
    if scale != 1:
        q = ctx.emit(R.multiply(q, relax.const(scale, dtype)))
    rank = len(shape_of(k))
    k_t = ctx.emit(R.permute_dims(k, list(range(rank - 2)) + [rank - 1, rank - 2]))
    scores = ctx.emit(R.matmul(q, k_t))
    additive, keep = _additive_mask(ctx, attn_mask, is_causal, rows, cols, dtype)
    if additive is not None:
        scores = ctx.emit(R.add(scores, _expr(additive, dtype)))
    weights = ctx.emit(R.nn.softmax(scores, axis=-1))
    if keep is not None:
        weights = ctx.emit(R.multiply(weights, _expr(keep, dtype)))
    return ctx.emit(R.matmul(weights, v))
