"""Float arithmetic kept as written when a fused kernel inlines one op into the next.

TVM's simplifier rewrites float expressions as if they were real numbers. Inlined into its
consumer, PyTorch's `1.5 - (x + 1.5)` became `0 - x`, and `0.5 - hardsigmoid(y)`,
`0.5 - (y / 6 + 0.5)`, became `0 - y / 6` (fuzz seeds 72003 and 72819). In float32 they
differ: `x + 1.5` rounds, and for a tiny x PyTorch gets exactly 0. So the fused kernel
computed other bits than the same ops unfused, and than PyTorch.

Before an elementwise block is inlined, the float value it stores is wrapped in an opaque
call, `ub_float_barrier(v)`, which the simplifier cannot see through. The C printer prints
the argument alone, so the C evaluates every op as written: C rounds each float operation,
and -ffp-contract=off keeps the compiler from contracting them.
"""

from __future__ import annotations

from tvm import ir, s_tir, tirx

BARRIER = "ub_float_barrier"


def is_barrier(expr) -> bool:
    return (isinstance(expr, ir.Call) and expr.op.name.endswith("call_pure_extern")
            and expr.args[0].value == BARRIER)


def wrap_stored_value(sch: s_tir.Schedule, block) -> None:
    """In `sch`, wrap the float value `block` stores in the barrier (once)."""
    stmt = sch.get(block)
    store = stmt.body
    if (not isinstance(store, tirx.BufferStore) or not str(store.value.ty).startswith("float")
            or is_barrier(store.value)):
        return
    kept = tirx.call_pure_extern(str(store.value.ty), BARRIER, store.value)
    new = s_tir.stmt.SBlock(stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint,
                            tirx.BufferStore(store.buffer, kept, store.indices), stmt.init,
                            stmt.alloc_buffers, stmt.match_buffers, stmt.annotations)
    sch.state.replace(sch.get_sref(block), new, {stmt: new})
