"""One flat loop for an elementwise block.

An elementwise kernel over [N, C, H, W] is printed as four nested loops; when the innermost
extent is short (8 columns of a small feature map) gcc's vectoriser gives up on the nest
("complicated access pattern") and the kernel runs one element at a time. Fusing the loops of
the block into one makes it a single long unit-stride loop that gcc vectorises.

Fusing is kept only where the flattened indices simplify back to the fused counter: an
operand read through a broadcast or a reshape would get a division and a remainder per
element instead, so a nest whose indices gain any `//` or `%` stays as it is. The indices are
judged as lowering will print them (flattened, then simplified with the loop ranges known),
on the nest alone: lowering the whole kernel for every trial cost seconds on a large model.
"""

from __future__ import annotations

import tvm
from tvm import ir, prim, s_tir, tirx

from .tir_access import UnknownTir, operands

SHORT_INNER = 64  # nests whose innermost loop is at least this long are vectorised as they are
_DIV_MOD = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)


def fuse_elementwise(sch: s_tir.Schedule) -> s_tir.Schedule:
    """`sch` with the loops of each short-innermost elementwise block fused, or `sch` itself
    where fusing would add divisions."""
    try:
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - no root block: nothing to fuse
        return sch
    for index in range(len(blocks)):
        if not _short_elementwise(sch, list(sch.get_child_blocks(sch.get_sblock("root")))[index]):
            continue  # judged on `sch`: a trial copy costs more than the check
        trial = s_tir.Schedule(sch.mod)
        block = list(trial.get_child_blocks(trial.get_sblock("root")))[index]
        before = _nest_div_mods(trial, block)
        try:
            trial.fuse(*trial.get_loops(block))
        except Exception:  # noqa: BLE001 - the nest is not perfect
            continue
        after = _nest_div_mods(trial, block)
        if before is not None and after is not None and after <= before:
            sch = trial
    return sch


def _short_elementwise(sch: s_tir.Schedule, block) -> bool:
    """No reduction axis, and a nest of two or more loops whose innermost one is short."""
    if any(int(v.iter_type) != tirx.IterVar.DataPar for v in sch.get(block).iter_vars):
        return False
    loops = sch.get_loops(block)
    return len(loops) >= 2 and int(sch.get(loops[-1]).extent) < SHORT_INNER


def _nest_div_mods(sch: s_tir.Schedule, block) -> int | None:
    """Divisions and remainders in the loop nest around `block` (every block the nest holds),
    or None where the nest holds something the count does not model."""
    try:
        return _stmt(tvm.sym.Analyzer(), sch.get(sch.get_loops(block)[0]))
    except UnknownTir:
        return None


def _stmt(analyzer, s) -> int:
    if isinstance(s, tirx.For):
        analyzer.bind(s.loop_var, ir.Range.from_min_extent(s.min, s.extent))
        return _stmt(analyzer, s.body)
    if isinstance(s, tirx.SeqStmt):
        return sum(_stmt(analyzer, x) for x in s)
    if isinstance(s, s_tir.SBlockRealize) and s.block.init is None:
        for iv, value in zip(s.block.iter_vars, s.iter_values):
            analyzer.bind(iv.var, value)  # the simplifier substitutes the binding
        return _expr(analyzer, s.predicate) + _stmt(analyzer, s.block.body)
    if isinstance(s, tirx.BufferStore):
        return _flat_index(analyzer, s.buffer, s.indices) + _expr(analyzer, s.value)
    raise UnknownTir(type(s).__name__)


def _expr(analyzer, e) -> int:
    if isinstance(e, ir.TensorLoad):
        return _flat_index(analyzer, e.source, e.indices)
    if isinstance(e, (prim.IntImm, prim.FloatImm, ir.StringImm)):
        return 0
    if not str(e.ty).startswith("float") and not _loads(e):
        # index arithmetic in the value (a concatenation's `ax1 == 1`), simplified whole as
        # lowering does: with the loops fused that is `80 <= f`, no division
        return _div_mods(analyzer.simplify(e))
    return sum(_expr(analyzer, c) for c in operands(e))


def _flat_index(analyzer, buffer, indices) -> int:
    return sum(_div_mods(analyzer.simplify(i)) for i in buffer.offset_of(list(indices)))


def _div_mods(e) -> int:
    return isinstance(e, _DIV_MOD) + sum(_div_mods(c) for c in operands(e))


def _loads(e) -> bool:
    return isinstance(e, ir.TensorLoad) or any(_loads(c) for c in operands(e))
