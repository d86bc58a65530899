"""nn.Embedding and F.embedding: rows of the table gathered by integer ids.

The ids are a model input (int64 as PyTorch gives them, or int32), possibly reshaped, or a
constant (`torch.arange` for positions). PyTorch raises IndexError for an id outside
[0, num_embeddings); ubitrain cannot read the table there, so the C step checks every id of
that input before any kernel runs and returns UB_ERR_INDEX_RANGE (the trainer raises
InputError), and a constant is checked now. Any op other than a view between the input and
the embedding could change the ids, so it is refused rather than checked on the wrong values.

The gradient is a scatter-add into the table with no gradient for `padding_idx`, each row
scaled by 1 / its id's count in the batch with `scale_grad_by_freq` (training/embedding.py).
"""

from __future__ import annotations

import math

import torch
import tvm

from ...ops.embedding import embedding
from .layout import reshape_to
from .registry import aten, converts, dtype_of, shape_of, unsupported

# ops that only rearrange a tensor: every id they pass on is an id of their input, and all of
# them (a check of the input is then the check PyTorch makes of the ids)
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
          aten.flatten.using_ints, aten.unsqueeze.default, aten.squeeze.dim,
          aten.squeeze.dims, aten.squeeze.default, aten.permute.default,
          aten.transpose.int, aten.t.default, aten.clone.default, aten.alias.default}


def _input_of(node) -> torch.fx.Node | None:
    """The model input placeholder that `node` views, or None."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and \
            node.target in _VIEWS:
        node = node.args[0]
    if isinstance(node, torch.fx.Node) and node.op == "placeholder" and \
            node.meta.get("val") is not None:
        return node
    return None


@converts(aten.embedding.default)
def _embedding(ctx, node, weight, ids, padding_idx=-1, scale_grad_by_freq=False,
               sparse=False):
    num, dim = shape_of(weight)
    if sparse:
        unsupported(ctx, "Embedding(sparse=True) (a sparse gradient)",
                    "use sparse=False: ubitrain updates the table densely")
    if dtype_of(ids) not in ("int64", "int32"):  # PyTorch's own two
        unsupported(ctx, f"embedding ids of dtype {dtype_of(ids)}",
                    "pass the ids as an int64 or int32 tensor")
    if isinstance(ids, tvm.ir.Constant):
        values = ids.value.numpy()
        if values.size and (values.min() < 0 or values.max() >= num):
            unsupported(ctx, f"constant embedding ids from {values.min()} to {values.max()}",
                        f"use ids in [0, {num})")
    else:
        source = _input_of(node.args[1])
        if source is None or source.name not in ctx.model_inputs:
            unsupported(ctx, "embedding ids computed inside the model",
                        "pass the ids as a model input (reshaping is fine) or a constant, "
                        "so that the step can check them against the table")
        ctx.index_bounds[source.name] = min(num, ctx.index_bounds.get(source.name, num))
    shape = shape_of(ids)
    flat = reshape_to(ctx, ids, [math.prod(shape)]) if len(shape) != 1 else ids
    # PyTorch passes -1 for "no padding row" (nn.Embedding has already made a negative one
    # count from the end)
    padding_idx = int(padding_idx) if padding_idx is not None and padding_idx >= 0 else -1
    rows = embedding(ctx.bb, weight, flat, padding_idx, bool(scale_grad_by_freq))
    return reshape_to(ctx, rows, [*shape, dim])

