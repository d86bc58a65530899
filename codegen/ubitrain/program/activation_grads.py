"""Which printed kernels are the gradient mask of a ReLU or a clamp (ReLU6, hardtanh's
backward): `out[i] = select(lo < z[i] (and z[i] < hi), dz[i], c[0])` over the parameters
(z, dz, c, out), z the activation's output, dz its gradient and c a constant 0.

Kernels are recognised from their lowered TIR, never from their names, for the program's
fusions of that mask into the kernel before it (program/pool_relu.py) or after it
(program/bn_activation.py).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class GradientMask:
    """A gradient mask kernel: its bounds (hi None for a ReLU's `lo < z`) and which of its
    arguments is z, dz, the constant c and the output, as its TIR reads and writes them."""

    lo: float
    hi: float | None
    z: int
    dz: int
    zero: int
    out: int


def gradient_mask(library, kernel: str) -> GradientMask | None:
    """The mask kernel `kernel` is, or None: one store per element of
    `select(lo < z[i] (and z[i] < hi), dz[i], c[0])`."""
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

    def element(e, idx):  # the parameter e loads at idx (None: element 0), or None
        if not isinstance(e, ir.TensorLoad):
            return None
        if idx is None:
            at = all(_is_const(i, 0) for i in e.indices)
        else:
            at = len(e.indices) == len(idx) and all(
                tvm_ffi.structural_equal(a, b) for a, b in zip(e.indices, idx))
        return acc.key(e.source) if at else None

    def bound_below(e):  # lo < z[i]: (lo, z)
        if isinstance(e, prim.LT) and isinstance(e.a, prim.FloatImm):
            z = element(e.b, index)
            return None if z is None else (e.a.value, z)
        return None

    def bound_above(e):  # z[i] < hi: (hi, z)
        if isinstance(e, prim.LT) and isinstance(e.b, prim.FloatImm):
            z = element(e.a, index)
            return None if z is None else (e.b.value, z)
        return None

    cond = sel.condition
    if isinstance(cond, prim.LT) and _is_const(cond.a, 0) and isinstance(cond.b, prim.Cast):
        cond = cond.b.value  # 0 < (int64)(bool): TIR's boolean as a number
    below, hi = bound_below(cond), None
    if below is None and isinstance(cond, prim.And):
        below, above = bound_below(cond.a), bound_above(cond.b)
        if below is None or above is None or above[1] != below[1]:
            return None
        hi = above[0]
    if below is None:
        return None
    lo, z = below
    roles = (z, element(sel.true_value, index), element(sel.false_value, None),
             acc.key(store.buffer))
    if None in roles or len(set(roles)) != 4:
        return None
    return GradientMask(lo, hi, *roles)


def is_zero(slot: Slot) -> bool:
    """A constant slot holding one +0.0 (the mask's `c`, what a masked element gets)."""
    return (slot.kind == "constant" and slot.value is not None and slot.value.size == 1
            and float(slot.value.reshape(-1)[0]) == 0.0
            and not np.signbit(slot.value.reshape(-1)[0]))


def _is_const(e, value) -> bool:
    return isinstance(e, (prim.IntImm, prim.FloatImm)) and e.value == value
