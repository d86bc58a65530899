"""TensorIR schedules applied to each kernel before it is lowered and printed.

Every schedule first inlines cheap producer blocks (padding, broadcasts, reshapes, fills)
into their consumers: the padded copy of a conv input then never exists, which removes the
kernel's largest scratch buffer. In a fused kernel, elementwise intermediates are inlined
into their elementwise consumers too, so a fused chain is one loop nest. The default
schedule then orders and tiles the reduction blocks (conv, conv gradients, matmuls) so that
the innermost loop is unit-stride, free of conditions and vectorizable by the C compiler
(reduction_schedule.py), and fuses the loops of elementwise blocks into one long loop
(elementwise_schedule.py). Targets pick a
schedule by name in `SCHEDULES`; "inline_only" is the unscheduled reference.
"""

from tvm import s_tir, tirx

from ..lowering.tir_lower import KEEP_STAGE
from .elementwise_schedule import fuse_elementwise
from .float_barrier import wrap_stored_value
from .reduction_schedule import tile_reductions

PAD_PREFIXES = ("pad", "T_pad", "data_dilate")
INLINE_PREFIXES = ("pad", "T_pad", "data_dilate", "T_reshape", "T_broadcast", "T_full",
                   "T_expand_dims", "T_transpose", "T_strided_slice")


def inline_cheap_producers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return _inline(s_tir.Schedule(func)).mod["main"]


def tiled(func: tirx.PrimFunc) -> tirx.PrimFunc:
    sch = _inline(s_tir.Schedule(func))
    tile_reductions(sch)
    return fuse_elementwise(sch).mod["main"]


def _inline(sch: s_tir.Schedule) -> s_tir.Schedule:
    changed = True
    while changed:  # inlining one block can make another inlinable
        changed = False
        for block in sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []:
            cheap = _cheap(sch, block)
            if cheap or _elementwise_intermediate(sch, block):
                if not cheap:  # arithmetic: the simplifier must not merge it with the next op
                    wrap_stored_value(sch, block)
                try:
                    sch.compute_inline(block)
                    changed = True
                    break
                except s_tir.ScheduleError:  # an output block, or one read in a reduction init
                    continue
    return sch


def _cheap(sch, block) -> bool:
    b = sch.get(block)
    if b.name_hint.startswith(PAD_PREFIXES) and str(b.writes[0].source.dtype) == "int8":
        return False  # an int8 padded copy is a quarter of float32's: kept, the conv's inner
        # loop is free of bounds checks
    return b.name_hint.startswith(INLINE_PREFIXES)


def _elementwise_intermediate(sch, block) -> bool:
    """A non-reduction block of a fused kernel (lowering/fusion.py) whose consumers each
    run no more iterations than it writes elements: non-reduction blocks writing no more
    than it, or a reduction over exactly its elements (a bias gradient's sum of a ReLU
    mask's output). Inlining it removes an intermediate buffer without computing any element
    more than once per consumer (a consumer that broadcasts it, or a reduction that reads
    each element many times, would recompute it)."""
    if _is_reduction(sch, block) or KEEP_STAGE in sch.get(block).annotations:
        return False
    consumers = sch.get_consumers(block)
    size = _written_elements(sch, block)
    return bool(consumers) and all(
        _iterations(sch, c) <= size if _is_reduction(sch, c) else _written_elements(sch, c) <= size
        for c in consumers)


def _iterations(sch, block) -> int:
    n = 1
    for v in sch.get(block).iter_vars:
        n *= int(v.dom.extent)
    return n


def _is_reduction(sch, block) -> bool:
    return any(int(v.iter_type) == tirx.IterVar.CommReduce for v in sch.get(block).iter_vars)


def _written_elements(sch, block) -> int:
    total = 0
    for region in sch.get(block).writes:
        n = 1
        for r in region.source.shape:
            n *= int(r)
        total += n
    return total


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


SCHEDULES = {"inline_only": inline_cheap_producers, "default": tiled}


def schedule(func: tirx.PrimFunc, target_schedule: str = "default") -> tirx.PrimFunc:
    return SCHEDULES[target_schedule](func)
