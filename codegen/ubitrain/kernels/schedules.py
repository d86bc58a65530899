"""TensorIR schedules applied to each kernel before it is lowered and printed.

The default schedule inlines cheap producer blocks (padding, broadcasts, reshapes, fills)
into their consumers: the padded copy of a conv input then never exists, which removes the
kernel's largest scratch buffer. Targets add their own schedules by name in `SCHEDULES`.
"""

from tvm import s_tir, tirx

INLINE_PREFIXES = ("pad", "T_pad", "T_reshape", "T_broadcast", "T_full", "T_expand_dims",
                   "T_transpose", "T_strided_slice")


def inline_cheap_producers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    sch = s_tir.Schedule(func)
    changed = True
    while changed:  # inlining one block can make another inlinable
        changed = False
        for block in sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []:
            name = sch.get(block).name_hint
            if name.startswith(INLINE_PREFIXES):
                try:
                    sch.compute_inline(block)
                    changed = True
                    break
                except Exception:  # an output block, or one read in a reduction init
                    continue
    return sch.mod["main"]


def _has_root(sch) -> bool:
    try:
        sch.get_sblock("root")
        return True
    except Exception:
        return False


SCHEDULES = {"default": inline_cheap_producers}


def schedule(func: tirx.PrimFunc, target_schedule: str = "default") -> tirx.PrimFunc:
    return SCHEDULES[target_schedule](func)
