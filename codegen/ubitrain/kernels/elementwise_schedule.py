"""One flat loop for an elementwise block.

An elementwise kernel over [N, C, H, W] is printed as four nested loops; when the innermost
extent is short (8 columns of a small feature map) gcc's vectoriser gives up on the nest
("complicated access pattern") and the kernel runs one element at a time. Fusing the loops of
the block into one makes it a single long unit-stride loop that gcc vectorises.

Fusing is kept only where the flattened indices simplify back to the fused counter: an
operand read through a broadcast or a reshape would get a division and a remainder per
element instead, so a block whose lowered form gains any `//` or `%` keeps its loop nest.
"""

from __future__ import annotations

import re

from tvm import s_tir, tirx

from ..lowering.tir_lower import lower_prim_func

SHORT_INNER = 64  # nests whose innermost loop is at least this long are vectorised as they are
_DIV_MOD = re.compile(r"//|%|floordiv|floormod")


def fuse_elementwise(sch: s_tir.Schedule) -> s_tir.Schedule:
    """`sch` with the loops of each short-innermost elementwise block fused, or `sch` itself
    where fusing would add divisions."""
    try:
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - no root block: nothing to fuse
        return sch
    base = None  # divisions and remainders of the kernel as it stands, counted when needed
    for index in range(len(blocks)):
        if not _short_elementwise(sch, list(sch.get_child_blocks(sch.get_sblock("root")))[index]):
            continue  # judged on `sch`: a trial copy costs more than the check
        trial = s_tir.Schedule(sch.mod)
        block = list(trial.get_child_blocks(trial.get_sblock("root")))[index]
        try:
            trial.fuse(*trial.get_loops(block))
        except Exception:  # noqa: BLE001 - loops shared with another block
            continue
        base = _div_mods(sch.mod["main"]) if base is None else base
        fused = _div_mods(trial.mod["main"])
        if fused <= base:
            sch, base = trial, fused
    return sch


def _short_elementwise(sch: s_tir.Schedule, block) -> bool:
    """No reduction axis, and a nest of two or more loops whose innermost one is short."""
    if any(int(v.iter_type) != tirx.IterVar.DataPar for v in sch.get(block).iter_vars):
        return False
    loops = sch.get_loops(block)
    return len(loops) >= 2 and int(sch.get(loops[-1]).extent) < SHORT_INNER


def _div_mods(func: tirx.PrimFunc) -> int:
    return len(_DIV_MOD.findall(str(lower_prim_func(func))))
