"""Kernels of the ops that have micro-kernels, made the way a training graph makes them: a
Relax conv2d (or matmul, or a Linear layer's matmul of a transposed weight) with its Relax
Gradient, legalized with the tagging rules of ubitrain/lowering/legalize.py. The tests and
benchmarks/icount.py build their kernel variants from these PrimFuncs."""

from __future__ import annotations

from tvm import relax

from ubitrain.kernels.microkernels.match import MATCHERS
from ubitrain.lowering.transposed_matmul import fold_weight_transposes
from ubitrain.ops.tagging import op_info, tagging_legalizations


def _legalized_funcs(build_body, params) -> list:
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(build_body(bb)))
        bb.emit_func_output(out)
    mod = fold_weight_transposes(relax.transform.Gradient("main")(bb.get()))
    mod = relax.transform.LegalizeOps(customize_legalize_map=tagging_legalizations())(mod)
    funcs = [(gv.name_hint, f) for gv, f in mod.functions.items()
             if not isinstance(f, relax.Function) and op_info(f) is not None
             and op_info(f)["op"] in MATCHERS]
    return [f for _, f in sorted(funcs, key=lambda item: item[0])]


def conv2d_funcs(x_shape, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                 groups=1) -> list:
    """The forward conv, its data gradient (conv2d_transpose) and weight gradient."""
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.Var("w", relax.TensorType(w_shape, "float32"))
    pad = [padding[0], padding[1], padding[0], padding[1]]
    return _legalized_funcs(lambda bb: bb.emit(relax.op.nn.conv2d(
        x, w, strides=stride, padding=pad, dilation=dilation, groups=groups)), [x, w])


def matmul_funcs(m: int, k: int, n: int) -> list:
    """a [m, k] . b [k, n] and its two gradients."""
    a = relax.Var("a", relax.TensorType((m, k), "float32"))
    b = relax.Var("b", relax.TensorType((k, n), "float32"))
    return _legalized_funcs(lambda bb: bb.emit(relax.op.matmul(a, b)), [a, b])


def linear_funcs(m: int, k: int, n: int) -> list:
    """A Linear layer's a [m, k] . w [n, k]^T (weight read as stored) and its two gradients."""
    a = relax.Var("a", relax.TensorType((m, k), "float32"))
    w = relax.Var("w", relax.TensorType((n, k), "float32"))
    return _legalized_funcs(
        lambda bb: bb.emit(relax.op.matmul(a, bb.emit(relax.op.permute_dims(w)))), [a, w])


def max_pool2d_backward_funcs(x_shape, kernel, stride, padding=(0, 0), dilation=(1, 1),
                              ceil_mode=False) -> list:
    """The gradient of an NCHW max_pool2d (ubitrain's legalization,
    ubitrain/ops/gradients.py)."""
    from ubitrain.ops.gradients import register_gradients

    register_gradients()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    pad = [padding[0], padding[1], padding[0], padding[1]]
    return _legalized_funcs(lambda bb: bb.emit(relax.op.nn.max_pool2d(
        x, kernel, stride, pad, dilation, ceil_mode=ceil_mode)), [x])


def batch_norm_funcs(x_shape, acc: str = "float64", momentum: float = 0.1,
                     eps: float = 1e-5) -> list:
    """Training-mode BatchNorm's statistics and its backward (ubitrain/lowering/fused_kernels.py),
    reductions accumulated in `acc`."""
    from ubitrain.lowering.fused_kernels import FUSED_KERNELS

    channels = (x_shape[1],)
    x, dy = (relax.Var(n, relax.TensorType(x_shape, "float32")) for n in ("x", "dy"))
    w, b, rm, rv = (relax.Var(n, relax.TensorType(channels, "float32"))
                    for n in ("w", "b", "rm", "rv"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, dy, w, b, rm, rv]):
        with bb.dataflow():
            out = bb.emit(FUSED_KERNELS["batch_norm_train"](bb, x, w, b, rm, rv,
                                                            momentum=momentum, eps=eps,
                                                            acc=acc))
            mean, rstd = (bb.emit(relax.TupleGetItem(out, i)) for i in (1, 2))
            grads = bb.emit(FUSED_KERNELS["batch_norm_train_backward"](bb, x, w, mean, rstd,
                                                                       dy, acc=acc))
            done = bb.emit_output(relax.Tuple([out, grads]))
        bb.emit_func_output(done)
    funcs = [(gv.name_hint, f) for gv, f in bb.get().functions.items()
             if not isinstance(f, relax.Function) and op_info(f) is not None]
    return [f for _, f in sorted(funcs, key=lambda item: item[0])]
