"""Lower a scheduled TensorIR PrimFunc to the flat form the C printer reads.

The pass list is TVM's own default TIR pipeline cut down to what a single-threaded CPU
kernel needs: blocks become plain loops, buffers become 1-D, indices become 32-bit
(cheap on Cortex-M), and no vectorization (the C compiler or a micro-kernel does that).
"""

import tvm
from tvm import s_tir, tirx

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


# The last few (func, lowered) pairs: a kernel's schedule lowers its candidates to count their
# divisions (kernels/elementwise_schedule.py), and the library then lowers the one it kept.
# A PrimFunc is immutable, so the same object always lowers to the same result.
_RECENT: list[tuple[tirx.PrimFunc, tirx.PrimFunc]] = []


def lower_prim_func(func: tirx.PrimFunc) -> tirx.PrimFunc:
    for known, lowered in _RECENT:
        if known.same_as(func):
            return lowered
    mod = tvm.IRModule({"main": func})
    lowered = tvm.transform.Sequential(LOWERING_PASSES)(mod)["main"]
    _RECENT.insert(0, (func, lowered))
    del _RECENT[4:]
    return lowered
