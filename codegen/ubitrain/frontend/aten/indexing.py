"""Indexing by a constant tensor: `x[:, idx]`, `x[..., idx]`, `torch.index_select(x, d, idx)`,
`x[i, j]` on adjacent dimensions, with the indices constants (a plain tensor attribute, a
`torch.tensor` made in `forward`, or computed from `arange`).

The indices are known now, so they are checked now (PyTorch's IndexError would come at run
time), and negative ones count from the end as in PyTorch's `x[:, idx]`. An index that is
computed inside the model, or comes from its inputs or state (a registered buffer is state:
`load_parameters` can change it), would need a check in every step and a data-dependent
gradient: it is refused. (A bool mask gives a data-dependent shape, which torch.export
does not trace.) The gather and its scatter-add gradient are one fused op (training/take.py).
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ...ops.take import take
from .layout import reshape_to
from .registry import aten, converts, shape_of, unsupported


def _constant_indices(ctx, idx, what: str) -> np.ndarray:
    if not isinstance(idx, tvm.ir.Constant):
        unsupported(ctx, f"{what} with an index computed inside the model or taken from its "
                    "inputs or buffers", "index by a constant tensor: a plain tensor attribute "
                    "(self.idx = torch.tensor([...]), not a registered buffer) or a "
                    "torch.tensor([...]) made in forward")
    values = idx.value.numpy()
    if values.dtype not in (np.int64, np.int32):
        unsupported(ctx, f"{what} with {values.dtype} indices", "use int64 or int32 indices")
    return values


def gather(ctx, x, dim: int, values: np.ndarray, what: str, negative_ok: bool):
    """x gathered along `dim` at the constant `values` (any shape, which replaces `dim`)."""
    shape = shape_of(x)
    n = shape[dim]
    low = -n if negative_ok else 0
    if values.size == 0:
        unsupported(ctx, f"{what} with no indices", "select at least one element")
    if values.min() < low or values.max() >= n:
        unsupported(ctx, f"{what} with indices from {values.min()} to {values.max()} on a "
                    f"dimension of size {n}", f"use indices in [{low}, {n})")
    flat = relax.const(np.mod(values, n).reshape(-1).astype(np.int32))
    outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    rows = take(ctx.bb, reshape_to(ctx, x, [outer, n, inner]), flat)
    return reshape_to(ctx, rows, [*shape[:dim], *values.shape, *shape[dim + 1:]])


@converts(aten.index_select.default)
def _index_select(ctx, node, x, dim, index):
    dim = dim % max(len(shape_of(x)), 1)
    values = _constant_indices(ctx, index, "index_select")
    if values.ndim > 1:  # PyTorch's own rule
        unsupported(ctx, "index_select with a multi-dimensional index", "use a 1-D index")
    return gather(ctx, x, dim, values, "index_select", negative_ok=False)


@converts(aten.index.Tensor)
def _index(ctx, node, x, indices):
    """`x[idx]`, `x[:, idx]`, `x[..., idx]`, and index tensors on adjacent dimensions,
    broadcast together (`x[i, j]`: what BERT's padding mask is indexed with,
    `mask[arange(b)[:, None, None, None], arange(n)[None, None, None, :]]`), whose result
    replaces those dimensions, as in PyTorch."""
    used = [i for i, t in enumerate(indices) if t is not None]
    if not used or used != list(range(used[0], used[0] + len(used))):
        unsupported(ctx, "index tensors on dimensions that are not adjacent (x[i, :, j])",
                    "index adjacent dimensions, or one with index_select at a time")
    dim = used[0]
    if len(used) == 1:
        values = _constant_indices(ctx, indices[dim], "x[..., idx]")
        return gather(ctx, x, dim, values, "x[..., idx]", negative_ok=True)
    shape = shape_of(x)
    sizes = [shape[d] for d in used]
    arrays = []
    for d, n in zip(used, sizes):
        values = _constant_indices(ctx, indices[d], "x[i, j]")
        if values.size and (values.min() < -n or values.max() >= n):
            unsupported(ctx, f"x[i, j] with indices from {values.min()} to {values.max()} on "
                        f"a dimension of size {n}", f"use indices in [{-n}, {n})")
        arrays.append(np.mod(values, n))
    try:
        arrays = np.broadcast_arrays(*arrays)
    except ValueError:
        unsupported(ctx, "x[i, j] with index shapes that do not broadcast",
                    "use index tensors that broadcast together")
    flat = np.zeros(arrays[0].shape, np.int64)
    for values, n in zip(arrays, sizes):  # row-major over the indexed dimensions
        flat = flat * n + values
    merged = reshape_to(ctx, x, [*shape[:dim], math.prod(sizes), *shape[dim + len(used):]])
    return gather(ctx, merged, dim, flat, "x[i, j]", negative_ok=False)
