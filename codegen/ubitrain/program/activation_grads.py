"""Which printed kernels are the gradient mask of a ReLU or a clamp (ReLU6, hardtanh's
backward): `out[i] = select(lo < z[i] (and z[i] < hi), dz[i], c[0])` over the parameters
(z, dz, c, out), z the activation's output, dz its gradient and c a constant 0.

Kernels are recognised from their lowered TIR, never from their names, for the program's
fusions of that mask into the kernel before it (program/pool_relu.py) or after it
(program/bn_activation.py).
"""

from __future__ import annotations

import numpy as np
import tvm_ffi
from tvm import ir, prim, tirx

from ..kernels.tir_access import Access, UnknownTir
from .ir import Slot


class _Stores(Access):
    """Access that also keeps the store nodes."""

    def __init__(self, func):
        self.store_nodes = []
        super().__init__(func)

    def stmt(self, s, loops, conditional):
        if isinstance(s, tirx.BufferStore):
            self.store_nodes.append(s)
        super().stmt(s, loops, conditional)


def mask_bounds(library, kernel: str) -> tuple[float, float | None] | None:
    """(lo, hi) of a gradient mask kernel (hi None for a ReLU's `lo < z`), or None."""
    func = library.lowered.get(kernel)
    if func is None or len(func.params) != 4:
        return None
    try:
        acc = _Stores(func)
    except UnknownTir:
        return None
    if len(acc.store_nodes) != 1 or not isinstance(acc.store_nodes[0].value, prim.Select):
        return None
    store = acc.store_nodes[0]
    sel, index = store.value, list(store.indices)

    def load_of(e, param: int, idx) -> bool:  # idx None: element 0
        if not isinstance(e, ir.TensorLoad) or acc.key(e.source) != param:
            return False
        if idx is None:
            return all(_is_const(i, 0) for i in e.indices)
        return len(e.indices) == len(idx) and all(
            tvm_ffi.structural_equal(a, b) for a, b in zip(e.indices, idx))

    def bound_below(e):  # lo < z[i]: lo
        if isinstance(e, prim.LT) and isinstance(e.a, prim.FloatImm) and load_of(e.b, 0, index):
            return e.a.value
        return None

    def bound_above(e):  # z[i] < hi: hi
        if isinstance(e, prim.LT) and isinstance(e.b, prim.FloatImm) and load_of(e.a, 0, index):
            return e.b.value
        return None

    cond = sel.condition
    if isinstance(cond, prim.LT) and _is_const(cond.a, 0) and isinstance(cond.b, prim.Cast):
        cond = cond.b.value  # 0 < (int64)(bool): TIR's boolean as a number
    lo, hi = bound_below(cond), None
    if lo is None and isinstance(cond, prim.And):
        lo, hi = bound_below(cond.a), bound_above(cond.b)
        if hi is None:
            return None
    if (lo is None or acc.key(store.buffer) != 3 or not load_of(sel.true_value, 1, index)
            or not load_of(sel.false_value, 2, None)):
        return None
    return lo, hi


def is_zero(slot: Slot) -> bool:
    """A constant slot holding one +0.0 (the mask's `c`, what a masked element gets)."""
    return (slot.kind == "constant" and slot.value is not None and slot.value.size == 1
            and float(slot.value.reshape(-1)[0]) == 0.0
            and not np.signbit(slot.value.reshape(-1)[0]))


def _is_const(e, value) -> bool:
    return isinstance(e, (prim.IntImm, prim.FloatImm)) and e.value == value
