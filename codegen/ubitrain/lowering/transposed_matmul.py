"""Linear layers without a transposed copy of their weight.

PyTorch's `linear` is `x @ W.T`; traced, it becomes `matmul(x, permute_dims(W))`, and
legalized, a transpose kernel that writes all of W.T before the matmul reads it. That copy
is as large as the weight: LeNet-5's fc1 (192,000 bytes) was the peak of its arena, and on a
microcontroller a frozen weight took its flash twice (itself and its folded transpose).

This pass, run on the differentiated step before legalization, replaces each
`matmul(a, permute_dims(w, [1, 0]))` of a 2-D `a` and `w` by one kernel that reads w as it
is: C[m, n] = sum_k a[m, k] * w[n, k], tagged like a matmul with `transpose_b` so that
targets with GEMM micro-kernels run it as their A . B^T GEMM (kernels/microkernels/). The
transpose, now unused, is dropped by dead-code elimination.
"""

from __future__ import annotations

import tvm
from tvm import relax, te

from ..ops.tagging import tag

_PERMUTE = tvm.ir.Op.get("relax.permute_dims")
_MATMUL = tvm.ir.Op.get("relax.matmul")


def matmul_transposed_b(a: te.Tensor, w: te.Tensor) -> te.Tensor:
    """a [M, K] . w [N, K]^T, summed over k in order, as TOPI's matmul does."""
    m, k = (int(d) for d in a.shape)
    n = int(w.shape[0])
    r = te.reduce_axis((0, k), name="k")
    return te.compute((m, n), lambda i, j: te.sum(a[i, r] * w[j, r], axis=r), name="matmul_nt")


def _transposed_2d(value) -> relax.Expr | None:
    """w when `value` is permute_dims(w, [1, 0]) of a 2-D w, else None."""
    if not (isinstance(value, relax.Call) and value.op.same_as(_PERMUTE)):
        return None
    w = value.args[0]
    axes = value.attrs.axes
    if len(w.ty.shape) != 2 or (axes is not None and [int(a) for a in axes] != [1, 0]):
        return None
    return w


@relax.expr_functor.mutator
class _TransposedMatmul(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.transposes: dict = {}  # var bound to permute_dims(w) -> w

    def visit_var_binding_(self, binding):
        w = _transposed_2d(binding.value)
        if w is not None:
            self.transposes[binding.var] = w
        super().visit_var_binding_(binding)

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if not call.op.same_as(_MATMUL) or len(call.args[0].ty.shape) != 2:
            return call
        w = self.transposes.get(call.args[1])
        if w is None or str(call.args[0].ty.dtype) != str(w.ty.dtype):
            return call
        a = call.args[0]
        out = self.builder_.call_te(matmul_transposed_b, a, w, primfunc_name_hint="matmul_nt")
        tag(self.builder_, out, "relax.matmul", {"transpose_b": True}, [a, w])
        return out

    def run(self) -> tvm.IRModule:
        for gvar, func in self.mod.functions.items():
            if isinstance(func, relax.Function):
                self.transposes = {}
                self.builder_.update_func(gvar, self.visit_expr(func))
        return self.builder_.get()


def fold_weight_transposes(mod: tvm.IRModule) -> tvm.IRModule:
    """Every matmul of a transposed 2-D weight as one kernel reading the weight untransposed."""
    return _TransposedMatmul(mod).run()
