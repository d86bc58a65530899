"""Dropout: a mask the C runtime draws every step from its seeded RNG."""

from __future__ import annotations

from tvm import relax
from tvm.relax import op as R

from .registry import aten, converts, unsupported


@converts(aten.native_dropout.default)
def native_dropout(ctx, node, x, p, train):
    if not train or p == 0:
        return (x, None)
    if p >= 1:
        unsupported(ctx, f"Dropout(p={p})", "use a probability below 1")
    mask = relax.Var(f"dropout_mask_{len(ctx.dropout_masks)}", x.ty)
    ctx.dropout_masks.append((mask, float(p)))
    # The mask holds 0 or 1/(1-p), drawn by the C runtime (ub_dropout_mask) every step.
    return (ctx.emit(R.multiply(x, mask)), mask)


@converts(aten.dropout.default)
def _dropout(ctx, node, x, p, train):
    return native_dropout(ctx, node, x, p, train)[0]
