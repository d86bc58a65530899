"""Gradient sums that fusion must leave where they are.

TVM's Gradient pass sums the gradient of a tensor read k times as a chain of adds, each
right after the part it adds is computed: `g1 = p1 + p2`, `g2 = g1 + p3`, ... An unrolled
recurrent layer reads its weights once per time step, so a 49-step GRU's hidden-to-hidden
weight has 49 parts, each as large as the weight. Left to FuseOps, the chain of elementwise
adds is one group, one kernel after the last part: every part stays alive until then (49
weight-sized buffers: 2.4 MB of arena for a 64-unit GRU whose weights are 49 KB). Kept out
of every group, each add runs where it stands, and at most one part lives beside the sum.

`gradient_sum_calls` finds the chains from what the step returns (each returned gradient,
back through the adds of its chain); `keep_apart` gives those calls a copy of their kernel
that FuseOps may not fuse (op pattern opaque). The adds are the same adds, in the same
order: the step is the same bit for bit.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..ops.tagging import op_info

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _add_of(mod: tvm.IRModule, value) -> bool:
    """Whether `value` calls the kernel of a Relax add of two tensors of one shape."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
        return False
    info = op_info(mod[value.args[0]])
    return (info is not None and info["op"] == "relax.add"
            and len(info["shapes"]) == 2 and info["shapes"][0] == info["shapes"][1])


def _leaves(expr):
    if isinstance(expr, relax.Tuple):
        for field in expr.fields:
            yield from _leaves(field)
    elif isinstance(expr, relax.Var):
        yield expr


def gradient_sum_calls(mod: tvm.IRModule, func: relax.Function) -> list:
    """The add calls of `func` that sum the parts of a gradient it returns, last first. The
    Gradient pass returns (what the function returned, (the gradients...)); a function it
    did not differentiate has no gradients."""
    returned = func.body.body
    if not (isinstance(returned, relax.Tuple) and isinstance(returned.fields[-1], relax.Tuple)):
        return []
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    found = []
    for var in _leaves(returned.fields[-1]):
        while _add_of(mod, values.get(var)):
            found.append(values[var])
            var = values[var].args[1].fields[0]  # the sum so far; fields[1] is the new part
    return found


@relax.expr_functor.mutator
class _KeepApart(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, opaque: int):
        super().__init__(mod)
        self.mod, self.opaque = mod, opaque
        self.calls: set = set()
        self.copies: dict = {}  # kernel -> its unfusable copy

    def visit_call_(self, call):
        apart = call in self.calls
        call = self.visit_expr_post_order(call)
        if not apart:
            return call
        kernel = call.args[0]
        if kernel not in self.copies:
            func = self.mod[kernel].with_attr("op_pattern", self.opaque)
            self.copies[kernel] = self.builder_.add_func(func, f"{kernel.name_hint}_sum")
        return relax.Call(call.op, [self.copies[kernel]] + list(call.args[1:]), call.attrs,
                          call.ty_args)

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions.items():
            if isinstance(func, relax.Function):
                self.calls = set(gradient_sum_calls(self.mod, func))
                if self.calls:
                    self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


def keep_apart(mod: tvm.IRModule, opaque: int) -> tvm.IRModule:
    """`mod` with every gradient sum calling a copy of its kernel of op pattern `opaque`."""
    return _KeepApart(mod, opaque).run()
