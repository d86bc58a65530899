"""Kernel fusion over the legalized training step (Sage, PockEngine: one compiled graph).

After legalization every Relax op of the forward, backward and loss is its own TIR kernel,
and each writes a whole tensor to memory for the next one to read back. TVM's operator
fusion joins them by the pattern of each kernel (`AnnotateTIROpPattern`: elementwise,
broadcast, injective, reduction, "output-elementwise-fusable" for conv and matmul, opaque),
and `FuseTIR` merges every group into one PrimFunc:

  * elementwise chains fuse into their producer, also across forward and backward (the
    BatchNorm normalisation steps, ReLU/ReLU6/GELU, their backward masks, residual adds);
  * conv / matmul take their elementwise consumers as an epilogue (bias add, activation,
    the activation's backward multiplied into a gradient);
  * injective producers (padding, transposes, broadcasts) fuse into the reduction reading
    them (BatchNorm's mean and variance, the softmax/cross-entropy sums).

Inside a fused kernel the schedule then inlines elementwise intermediates into their
consumers (kernels/schedules.py), so they never reach memory. Every value is computed by the
same floating-point operations in the same order as before, so a fused step gives the
unfused step's results bit for bit (tests/test_fusion.py).

A kernel that has a micro-kernel on the target (kernels/microkernels/) is left out of every
group, so that it still matches its template; so is each add that sums a gradient over the
uses of its tensor, so that the parts need not all live until the end
(lowering/gradient_sums.py).
"""

from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax, tirx

from .gradient_sums import keep_apart

OPAQUE = 8  # TVM's OpPatternKind::kOpaque: never fused with anything


def fuse_kernels(mod: tvm.IRModule, keep_whole: Callable[[tirx.PrimFunc], bool]) -> tvm.IRModule:
    """Fuse the call_tir kernels of "main" and "predict"; `keep_whole(func)` exempts one."""
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, tirx.PrimFunc) and keep_whole(func):
            mod[gvar] = func.with_attr("op_pattern", OPAQUE)
    mod = keep_apart(mod, OPAQUE)  # a gradient summed part by part, not all parts at the end
    mod = relax.transform.FuseOps()(mod)
    mod = relax.transform.FuseTIR()(mod)
    return relax.transform.DeadCodeElimination(["main", "predict"])(mod)
