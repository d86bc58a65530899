"""Lower a scheduled TensorIR PrimFunc to the flat form the C printer reads.

The pass list is TVM's own default TIR pipeline cut down to what a single-threaded CPU
kernel needs: blocks become plain loops, buffers become 1-D, indices become 32-bit
(cheap on Cortex-M), and no vectorization (the C compiler or a micro-kernel does that).
"""

import tvm
from tvm import s_tir, tirx

# A TE stage made with attrs={KEEP_STAGE: 1} stays a buffer of its own (kernels/schedules.py
# inlines no such stage): an expression reads its value many times (NITI's rounding rules
# read a value in each branch), and inlined, the nested expressions keep TVM's simplifier busy
# for minutes.
KEEP_STAGE = "ub_keep_stage"

LOWERING_PASSES = [
    s_tir.transform.LowerInitBlock(),
    s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
    s_tir.transform.ConvertBlocksToOpaque(),
    s_tir.transform.CompactBufferAllocation(),
    s_tir.transform.LowerMatchBuffer(),
    s_tir.transform.StmtSimplify(),
    s_tir.transform.LowerOpaqueBlock(),
    tirx.transform.FlattenBuffer(),
    tirx.transform.UnrollLoop(),  # loops the schedule marked unrolled (register tiles)
    tirx.transform.NarrowDataType(32),
    tirx.transform.StmtSimplify(),
    tirx.transform.RemoveNoOp(),
]


def lower_prim_func(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return tvm.transform.Sequential(LOWERING_PASSES)(tvm.IRModule({"main": func}))["main"]
