"""Legalization of fused training ops (training/fused_ops.py): each call becomes the call_tir
of ONE PrimFunc built from the op's TE kernel, with the target's accumulator dtype.

TVM's LegalizeOps never hands `relax.call_dps_packed` to a legalization (it is already
"lowered" to it), so a small mutator of ours rewrites these calls first.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import CompileError
from ..training.fused_ops import fused_op_of
from .batch_norm_kernels import batch_norm_train, batch_norm_train_backward
from .cross_entropy_kernels import softmax_cross_entropy, softmax_cross_entropy_backward
from .layer_norm_kernels import layer_norm, layer_norm_backward

FUSED_KERNELS = {
    "batch_norm_train": batch_norm_train,
    "batch_norm_train_backward": batch_norm_train_backward,
    "layer_norm": layer_norm,
    "layer_norm_backward": layer_norm_backward,
    "softmax_cross_entropy": softmax_cross_entropy,
    "softmax_cross_entropy_backward": softmax_cross_entropy_backward,
}


@relax.expr_functor.mutator
class _FusedOpLegalizer(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, acc: str):
        super().__init__(mod)
        self.mod, self.acc = mod, acc

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        found = fused_op_of(call) if call.op.same_as(_CALL_DPS_PACKED) else None
        if found is None:
            return call
        op, attrs = found
        if op not in FUSED_KERNELS:
            raise CompileError(f"fused op {op} has no kernel; known: {', '.join(FUSED_KERNELS)}")
        return self.builder_.call_te(FUSED_KERNELS[op], *call.args[1].fields, **attrs,
                                     acc=self.acc, primfunc_name_hint=op)

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions.items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def legalize_fused_ops(mod: tvm.IRModule, acc: str) -> tvm.IRModule:
    """Every fused-op call of `mod` as a call_tir of its kernel."""
    return _FusedOpLegalizer(mod, acc).run()
