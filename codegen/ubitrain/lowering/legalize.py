"""Relax ops legalized into TIR PrimFuncs, one per kernel of the step.

`relax.reshape` is kept out of legalization: it becomes a view that shares its source's
storage (program/walk.py). Conv and matmul PrimFuncs are tagged with their op so that a
micro-kernel can replace them (kernels/microkernels/); reductions accumulate in the
target's accumulator type (lowering/reductions.py).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..ops.tagging import tagging_legalizations
from .reductions import reduction_legalizations


def legalize_ops(mod: tvm.IRModule, accumulate_dtype: str = "float32") -> tvm.IRModule:
    custom = {"relax.reshape": lambda bb, call: call}  # kept as a view, never a kernel
    custom.update(tagging_legalizations())  # conv/matmul PrimFuncs remember their op
    if accumulate_dtype != "float32":
        custom.update(reduction_legalizations(accumulate_dtype))
    mod = relax.transform.LegalizeOps(customize_legalize_map=custom)(mod)
    return relax.transform.DeadCodeElimination(["main", "predict"])(mod)
