"""Fused training ops: one node for Relax's Gradient pass, one kernel each way.

A fused op is `R.call_dps_packed("ubitrain.<op>", (tensors...), out_types)`. Relax treats
it as a single call, so the Gradient pass differentiates it with ubitrain's rule (one
backward call, usually another fused op) instead of differentiating the chain of small
ops it stands for, whose intermediates would all stay alive for the backward pass.
lowering/fused_kernels.py later legalizes each call into ONE PrimFunc (several TE stages)
with the target's accumulator dtype, which is why the op stays symbolic until then.

Static attributes (eps, momentum) travel in the packed function's name, as JSON after a
`|`: call_dps_packed has no attributes, and a scalar among the tensor arguments breaks the
Gradient pass (it wants a tensor adjoint for every leaf of the argument tuple).
"""

from __future__ import annotations

import json

from tvm import relax
from tvm.relax import op as R
from tvm.relax.op.grad import no_grad

PREFIX = "ubitrain."


def fused_call(op: str, tensors, out_types, **attrs) -> relax.Call:
    """A call of fused op `op` (without the prefix) on `tensors`; a list of `out_types`
    gives a tuple-valued call."""
    name = PREFIX + op + ("|" + json.dumps(attrs, sort_keys=True) if attrs else "")
    return R.call_dps_packed(name, relax.Tuple(list(tensors)), out_types)


def fused_op_of(call) -> tuple[str, dict] | None:
    """(op name, attributes) of a fused-op call, or None for any other call."""
    func = call.args[0] if len(call.args) == 2 else None
    symbol = getattr(func, "global_symbol", None)
    if symbol is None or not str(symbol).startswith(PREFIX):
        return None
    op, _, attrs = str(symbol)[len(PREFIX):].partition("|")
    return op, (json.loads(attrs) if attrs else {})


def fused_gradient(rules: dict):
    """The FPrimalGradient of `relax.call_dps_packed`, dispatching to `rules[op]`.

    A rule gets `(orig_var, tensors, output_grad, attrs)` and returns one adjoint (or
    `None`: no gradient) per tensor argument; all None: the op stops the gradient."""

    def gradient(orig_var, orig_call, output_grad, ctx):
        found = fused_op_of(orig_call)
        if found is None or found[0] not in rules:
            name = found[0] if found else orig_call.args[0]
            raise ValueError(f"no gradient rule for the packed call {name}")
        op, attrs = found
        tensors = list(orig_call.args[1].fields)
        partials = rules[op](orig_var, tensors, output_grad, attrs)
        if all(p is None for p in partials):
            # no_grad of the whole argument tuple, which the pass skips; a tuple of no_grads
            # would become its tensors' adjoints, and the pass would go on into the ops
            # that computed them (an attention mask's comparisons), which have no rule
            return [no_grad(orig_call.args[0]), no_grad(orig_call.args[1])]
        partials = [no_grad(t) if p is None else p for t, p in zip(tensors, partials)]
        return [no_grad(orig_call.args[0]), relax.Tuple(partials)]

    return gradient
