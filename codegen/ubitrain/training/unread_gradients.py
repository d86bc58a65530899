"""Weight gradients that nothing reads are not computed, in fused backward ops too.

Relax's Gradient pass drops every backward op that only fed a frozen parameter, but a fused
op's backward is one call with all its gradients: a LayerNorm whose gamma and beta are
frozen (fine-tuning with LoRA, a sparse update) still summed dgamma and dbeta over every row
into two buffers of their own. Each such call whose outputs other than dx are never read
becomes the op's input-gradient-only variant.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..ops import layer_norm
from ..ops.fused_ops import fused_op_of

_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")
# fused backward op -> the variant that computes its first output (dx) alone
INPUT_ONLY = {layer_norm.BACKWARD: layer_norm.input_backward}


def _fused(value) -> tuple[str, dict] | None:
    if isinstance(value, relax.Call) and value.op.same_as(_CALL_DPS_PACKED):
        return fused_op_of(value)
    return None


def _dx_only(func: relax.Function) -> set:
    """The vars bound to an INPUT_ONLY op's call that are read only as `[0]`."""
    candidates, other_reads = set(), set()
    for block in func.body.blocks:
        for binding in block.bindings:
            found = _fused(binding.value)
            if found is not None and found[0] in INPUT_ONLY:
                candidates.add(binding.var)
            value = binding.value
            if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
                if value.index != 0:
                    other_reads.add(value.tuple_value)
            else:
                other_reads.update(relax.analysis.free_vars(value))
    other_reads.update(relax.analysis.free_vars(func.body.body))
    return {v for v in candidates if v not in other_reads}


@relax.expr_functor.mutator
class _InputOnly(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.prune: set = set()
        self.dx: dict = {}  # a pruned call's var -> its variant's var

    def visit_var_binding_(self, binding):
        value = binding.value
        if binding.var in self.prune:  # the call: its dx-only variant, a tensor
            op, attrs = _fused(value)
            tensors = [self.visit_expr(t) for t in value.args[1].fields]
            self.dx[binding.var] = self.builder_.emit(INPUT_ONLY[op](tensors, attrs),
                                                      binding.var.name)
        elif isinstance(value, relax.TupleGetItem) and value.tuple_value in self.dx:
            self.set_var_remap(binding.var, self.dx[value.tuple_value])  # its [0]: dx
        else:
            super().visit_var_binding_(binding)

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions.items():
            if isinstance(func, relax.Function):
                self.prune, self.dx = _dx_only(func), {}
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


def drop_unread_weight_gradients(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` (after the Gradient pass and dead-code elimination) with every fused backward
    whose weight gradients nothing reads replaced by its dx-only variant."""
    return _InputOnly(mod).run()
