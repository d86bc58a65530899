"""Gradient clipping by global norm (`clip_grad_norm=` of ub.SGD / ub.Adam / ub.AdamW), with
torch.nn.utils.clip_grad_norm_'s rule: total = the L2 norm over every trained gradient,
coefficient = min(max_norm / (total + 1e-6), 1), every gradient multiplied by it.

One builtin call after the last gradient (and after a micro-batch loop's accumulation) and
before any update computes the norm, in double, over exactly the gradients the updates read
(a channel-sparse update's trained rows only), and writes the coefficient as the last
element of the optimizer's coefficients; each update multiplies its gradient by it
(optim.py). Since the call reads every gradient, each update stays after it wherever the
early placement puts it, and no update is fused into its gradient's kernel.
"""

from __future__ import annotations

import math

from .ir import Call, Slot

CLIP = "ub_clip_grad_norm"


def clip_call(grads: list[Slot], coef: Slot, max_norm: float) -> Call:
    """The call that reads `grads` and writes the clipping coefficient into coef[-1]."""
    for g in grads:
        if g.dtype != "float32":
            raise ValueError(f"clip_grad_norm: gradient {g.name} is {g.dtype}, not float32")
    return Call(CLIP, list(grads) + [coef], [len(grads)], builtin=True,
                attrs={"max_norm": float(max_norm), "index": int(coef.shape[0]) - 1})


def clip_statement(call: Call, pointer) -> str:
    """The C of `call`; `pointer(slot, writable)` is a slot's C pointer expression."""
    *grads, coef = call.args
    lines = ["{ double ub_sq = 0.0;"]
    for g in grads:
        n = math.prod(g.shape)
        lines.append(f"  {{ const float *ub_g = {pointer(g, False)}; "
                     f"for (uint32_t ub_i = 0; ub_i < {n}u; ++ub_i) "
                     f"ub_sq += (double)ub_g[ub_i] * (double)ub_g[ub_i]; }}")
    lines.append(f"  double ub_clip = {call.attrs['max_norm']!r} / (sqrt(ub_sq) + 1e-6);")
    lines.append(f"  {pointer(coef, True)}[{call.attrs['index']}] = "
                 "ub_clip < 1.0 ? (float)ub_clip : 1.0f; }")
    return "\n    ".join(lines)
