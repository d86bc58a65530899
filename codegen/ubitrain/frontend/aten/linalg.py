"""Matrix products: matmul (vectors, batches, broadcasting), mm, bmm, addmm, baddbmm.

`relax.matmul` follows `torch.matmul` in every case (a 1-D operand is a row or column
vector that is dropped from the result, batch dimensions broadcast), and TVM's gradient
sums a broadcast operand's gradient back to its shape.
"""

from __future__ import annotations

from tvm.relax import op as R

from .registry import as_expr, aten, converts


@converts(aten.matmul.default, aten.mm.default, aten.bmm.default)
def matmul(ctx, node, a, b):
    return ctx.emit(R.matmul(a, b))


@converts(aten.addmm.default, aten.baddbmm.default)
def _add_matmul(ctx, node, c, a, b, beta=1, alpha=1):
    """beta * c + alpha * (a @ b). PyTorch ignores c where beta is 0 (a NaN in c stays
    out), so it is not even read then."""
    y = matmul(ctx, node, a, b)
    if alpha != 1:
        y = ctx.emit(R.multiply(y, as_expr(alpha, y)))
    if beta == 0:
        return y
    if beta != 1:
        c = ctx.emit(R.multiply(c, as_expr(beta, c)))
    return ctx.emit(R.add(c, y))
