"""Legalization of fused training ops (training/fused_ops.py): each call becomes the call_tir
of one PrimFunc built from the op's TE kernel, with the target's accumulator dtype. Only
BatchNorm's forward becomes two: its statistics (reductions), then y from x and them (a
broadcast kernel, which the activation or residual add after it joins in lowering/fusion.py).

TVM's LegalizeOps never hands `relax.call_dps_packed` to a legalization (it is already
"lowered" to it), so a small mutator of ours rewrites these calls first.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..errors import CompileError
from ..ops.fused_ops import fused_op_of
from ..ops.tagging import tag
from . import adaptive_pool_kernels as adaptive
from .activation_kernels import elu, elu_backward
from .attention_mask_kernels import attention_mask
from .batch_norm_kernels import batch_norm_apply, batch_norm_stats, batch_norm_train_backward
from .cross_entropy_kernels import softmax_cross_entropy, softmax_cross_entropy_backward
from .embedding_kernels import embedding, legalize_embedding_backward
from .layer_norm_kernels import layer_norm, layer_norm_backward, layer_norm_input_backward
from .niti_batch_norm_kernels import BATCH_NORM_KERNELS
from .niti_kernels import NITI_KERNELS
from .take_kernels import take, take_backward


def _batch_norm_train(bb, x, w, b, running_mean, running_var, momentum, eps, acc):
    """(y, save_mean, save_rstd, new_running_mean, new_running_var) in two kernels."""
    stats = bb.call_te(batch_norm_stats, x, running_mean, running_var, momentum=momentum,
                       eps=eps, acc=acc, primfunc_name_hint="batch_norm_stats")
    # the reductions have micro-kernels (kernels/microkernels/): say what they compute
    tag(bb, stats, "batch_norm_stats", dict(momentum=momentum, eps=eps, acc=acc),
        [x, running_mean, running_var])
    stats = bb.emit(stats)
    mean, rstd = relax.TupleGetItem(stats, 0), relax.TupleGetItem(stats, 1)
    y = bb.emit(bb.call_te(batch_norm_apply, x, mean, rstd, w, b,
                           primfunc_name_hint="batch_norm_apply"))
    return relax.Tuple([y] + [relax.TupleGetItem(stats, i) for i in range(4)])


def _one_kernel(te_func, tagged: bool = False):
    def legalize(bb, *tensors, acc, **attrs):
        call = bb.call_te(te_func, *tensors, **attrs, acc=acc,
                          primfunc_name_hint=te_func.__name__)
        if tagged:
            tag(bb, call, te_func.__name__, dict(attrs, acc=acc), tensors)
        return call
    return legalize


# op -> legalize(builder, *tensors, acc=, **attrs): the expression that replaces the call
FUSED_KERNELS = {
    "batch_norm_train": _batch_norm_train,
    "batch_norm_train_backward": _one_kernel(batch_norm_train_backward, tagged=True),
    "embedding_backward": legalize_embedding_backward,
    "attention_mask": _one_kernel(attention_mask),
    **{f.__name__: _one_kernel(f) for f in (
        layer_norm, layer_norm_backward, layer_norm_input_backward, softmax_cross_entropy,
        softmax_cross_entropy_backward,
        adaptive.adaptive_avg_pool2d, adaptive.adaptive_avg_pool2d_backward,
        adaptive.adaptive_max_pool2d, adaptive.adaptive_max_pool2d_backward, elu, elu_backward,
        embedding, take, take_backward)},
    **{name: _one_kernel(f) for name, f in NITI_KERNELS.items()},
    **{name: _one_kernel(f) for name, f in BATCH_NORM_KERNELS.items()},
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
        return FUSED_KERNELS[op](self.builder_, *call.args[1].fields, **attrs, acc=self.acc)

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions.items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def legalize_fused_ops(mod: tvm.IRModule, acc: str) -> tvm.IRModule:
    """Every fused-op call of `mod` as a call_tir of its kernel."""
    mod = _FusedOpLegalizer(mod, acc).run()
    # (y, ...)[0] of a split op is y itself, so y's consumers can fuse into its kernel
    return relax.transform.CanonicalizeBindings()(mod)
