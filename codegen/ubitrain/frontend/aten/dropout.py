"""Dropout and Bernoulli draws: masks the C runtime draws every step from its seeded RNG.

`native_dropout` (nn.Dropout, F.dropout) is one mask of 0 or 1/(1-p). In-place Dropout
(`nn.Dropout(inplace=True)`) and torchvision's StochasticDepth export as PyTorch's own
decomposition, `empty(...).bernoulli_(keep)` followed by a division by `keep` and a product:
`bernoulli.p` becomes a mask of 0 or 1 (1 with probability `keep`), and the model's own ops
do the rest, so the step computes what PyTorch computes with those draws.
fidelity/dropout.py draws the same masks in numpy for the referee.
"""

from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ..forward import RandomMask
from .registry import aten, converts, dtype_of, unsupported


def random_mask(ctx, like, p: float, scale: float, what: str):
    """A new mask shaped like `like`: 0 with probability `p`, else `scale`, drawn by the C
    runtime (ub_dropout_mask) at the start of every step, in graph order."""
    if dtype_of(like) != "float32":
        unsupported(ctx, f"{what} on a {dtype_of(like)} tensor",
                    "draw it on a float32 tensor (the runtime's masks are float32)")
    mask = relax.Var(f"random_mask_{len(ctx.random_masks)}", like.ty)
    ctx.random_masks.append(RandomMask(mask, float(p), float(scale)))
    return mask


@converts(aten.native_dropout.default)
def native_dropout(ctx, node, x, p, train):
    if not train or p == 0:
        return (x, None)
    if p >= 1:
        unsupported(ctx, f"Dropout(p={p})", "use a probability below 1")
    # 1/(1-p) from p as the C has it (float32), in double; the C emitter rounds it once
    scale = 1.0 / (1.0 - float(np.float32(p)))
    mask = random_mask(ctx, x, p, scale, f"Dropout(p={p})")
    return (ctx.emit(R.multiply(x, mask)), mask)


@converts(aten.dropout.default)
def _dropout(ctx, node, x, p, train):
    return native_dropout(ctx, node, x, p, train)[0]


@converts(aten.bernoulli.p)
def _bernoulli(ctx, node, x, p=0.5, generator=None):
    """`x.bernoulli_(p)`: 1 with probability p, else 0, shaped like x (whose values are not
    read). The C's generator draws it, not `generator`."""
    if not 0 <= p <= 1:
        unsupported(ctx, f"bernoulli_({p})", "use a probability in [0, 1]")
    return random_mask(ctx, x, 1.0 - p, 1.0, f"bernoulli_({p})")
