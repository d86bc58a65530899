"""Legalization of float32 reductions (sum, mean, variance, and collapse_sum, the gradient of a
broadcast such as a bias add) with a wider accumulator.

PyTorch's CPU kernels accumulate BatchNorm's batch statistics in double. TOPI's reductions
accumulate in the tensor's own float32, which leaves 20x more rounding residue in statistics
that are mathematically zero and, in BatchNorm over channels with little spread, feeds
chaotic amplification of that residue. Targets with a double-precision FPU accumulate in
float64 here; the others keep float32 (the target's `accumulate_dtype`).
"""

from __future__ import annotations

import math

from tvm import te, tirx


def _axes(axis, ndim: int) -> list[int]:
    if axis is None or len(axis) == 0:
        return list(range(ndim))
    return sorted(int(a) % ndim for a in axis)


def _reduce_index(shape, axes, keepdims):
    """Output shape, and a function from (output index, reduce vars) to the input index."""
    out_shape = [1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes]

    def input_index(out_idx, rvars):
        out_idx, rvars = list(out_idx), list(rvars)
        full = []
        for i in range(len(shape)):
            if i in axes:
                full.append(rvars.pop(0))
                if keepdims:
                    out_idx.pop(0)
            else:
                full.append(out_idx.pop(0))
        return full

    return out_shape, input_index


def _wide_sum(x, axes, keepdims, acc, transform=None, name="sum"):
    shape = [int(d) for d in x.shape]
    out_shape, input_index = _reduce_index(shape, axes, keepdims)
    rvars = [te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes]

    def body(*idx):
        value = x(*input_index(idx, rvars)).astype(acc)
        if transform is not None:
            value = transform(value, idx)
        return te.sum(value, axis=rvars)

    return te.compute(out_shape, body, name=f"{name}_acc")


def te_sum(x, axis, keepdims, acc):
    axes = _axes(axis, len(x.shape))
    total = _wide_sum(x, axes, keepdims, acc)
    return te.compute(total.shape, lambda *i: total(*i).astype(x.dtype), name="T_sum")


def te_mean(x, axis, keepdims, acc):
    axes = _axes(axis, len(x.shape))
    count = math.prod(int(x.shape[a]) for a in axes)
    total = _wide_sum(x, axes, keepdims, acc)
    return te.compute(total.shape, lambda *i: (total(*i) / tirx.const(count, acc)).astype(x.dtype),
                      name="T_mean")


def te_variance(x, axis, keepdims, acc):
    """Two passes, both accumulated wide: mean, then the mean squared deviation."""
    axes = _axes(axis, len(x.shape))
    count = tirx.const(math.prod(int(x.shape[a]) for a in axes), acc)
    total = _wide_sum(x, axes, True, acc, name="mean")
    mean = te.compute(total.shape, lambda *i: total(*i) / count, name="mean_wide")

    def squared_deviation(value, _):  # value is x at the current (output, reduce) index
        return value * value

    shape = [int(d) for d in x.shape]
    out_shape, input_index = _reduce_index(shape, axes, keepdims)
    rvars = [te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes]

    def body(*idx):
        full = input_index(idx, rvars)
        mean_idx = [0 if i in axes else full[i] for i in range(len(shape))]
        dev = x(*full).astype(acc) - mean(*mean_idx)
        return te.sum(dev * dev, axis=rvars)

    sq = te.compute(out_shape, body, name="sqdev_acc")
    return te.compute(sq.shape, lambda *i: (sq(*i) / count).astype(x.dtype), name="T_variance")


def te_collapse_sum(x, target_shape, acc):
    """Sum `x` down to `target_shape`, the shape it was broadcast from (a bias's gradient):
    over its leading extra dims and over every dim where the target has 1."""
    shape = [int(d) for d in x.shape]
    target = [int(d) for d in target_shape]
    lead = len(shape) - len(target)
    axes = [a for a in range(len(shape))
            if a < lead or (target[a - lead] == 1 and shape[a] != 1)]
    rvars = {a: te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes}

    def total(*idx):
        index = [rvars[a] if a in rvars else idx[a - lead] for a in range(len(shape))]
        return te.sum(x(*index).astype(acc), axis=list(rvars.values()))

    wide = te.compute(target, total, name="collapse_acc")
    return te.compute(target, lambda *i: wide(*i).astype(x.dtype), name="T_collapse_sum")


def _legalize(te_func, acc):
    def legalize(bb, call):
        x = call.args[0]
        dtype = str(x.ty.dtype)
        if dtype == "float32":
            wide = acc
        elif dtype.startswith("int") and te_func is te_sum:
            wide = dtype  # NITI's sums (pooling) are exact in their own type; TVM 0.27
            # crashes when a custom legalization declines an integer sum
        else:
            return None  # TVM's own legalization
        return bb.call_te(te_func, x, call.attrs.axis, call.attrs.keepdims, wide,
                          primfunc_name_hint=te_func.__name__[3:])
    return legalize


def _legalize_collapse(acc, target_arg):
    def legalize(bb, call):
        x = call.args[0]
        dtype = str(x.ty.dtype)
        if dtype != "float32" and not dtype.startswith("int"):
            return None
        target = call.args[1]
        shape = target.ty.shape if target_arg == "like" else target.values
        # an integer sum (NITI's bias gradient) is exact in its own type; TVM 0.27 crashes
        # when a custom legalization declines a collapse_sum
        wide = acc if dtype == "float32" else dtype
        return bb.call_te(te_collapse_sum, x, [int(d) for d in shape], wide,
                          primfunc_name_hint="collapse_sum")
    return legalize


def reduction_legalizations(acc: str) -> dict:
    """Sums, means and variances, and the gradients of broadcasts (bias gradients)."""
    return {"relax.sum": _legalize(te_sum, acc), "relax.mean": _legalize(te_mean, acc),
            "relax.variance": _legalize(te_variance, acc),
            "relax.collapse_sum_to": _legalize_collapse(acc, "to"),
            "relax.collapse_sum_like": _legalize_collapse(acc, "like")}
