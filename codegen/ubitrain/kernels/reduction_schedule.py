"""Loop order and tiling for the reduction blocks of training: conv, conv data/weight gradient,
matmul and its two backward products, collapse sums.

TE writes every reduction as `for spatial... for reduce...: out[s] += a * b`, with the
reduction's zero-init inside the innermost loop (`if (k == 0) out = 0`). That order keeps the
innermost loop a strided dot product that gcc cannot vectorize (a float sum is not
reassociated without -ffast-math) and that carries a condition. This schedule makes the
innermost loop a spatial one, unit-stride in the output and in the operand that varies with
it, with no condition:

    for spatial (outer)...
      for u_outer:                      # a "register" axis the vector operand does not use
        init: out[u, v] = 0             # decompose_reduction: the init leaves the loop nest
        for reduce...:
          for v:                        # last output axis, unit stride: gcc vectorizes it
            for u_inner (unrolled):     # reuses the loaded vector of the operand u_inner times
              out[u, v] += a[.., v + ..] * b[u, ..]

Blocks are recognised by structure, not by name: a float32 (or int32) block with reduction iterators
whose last spatial iterator indexes the output's last dimension with unit stride and every
read either independent of that iterator or indexed by it in its last dimension with a
small constant stride (1 for most; 2 to MAX_READ_STRIDE for strided pooling and convs). The
order of each output element's reduction is unchanged, so results are bit-identical to the
unscheduled kernel. float64 accumulators (lowering/reductions.py: BatchNorm statistics,
bias gradients) whose innermost reduction is unit-stride and long get partial sums across it
(`_factor_dot_product`; over whole planes, their rows fused into one loop, where the reads
allow): a different order of float64 additions, which vectorizes; the others only get their
init moved. Any block that does not fit is left as it was.
"""

from __future__ import annotations

from tvm import ir, s_tir
from tvm.ir import prim

VECTOR_ELEMENTS = 8  # split the vector axis into chunks of this many when it is long
# A shorter output row is still the vector axis: four lanes (SSE, NEON) and a scalar tail beat
# a scalar loop over the reduction (LeNet-5's second max-pool: rows of 5, where the scalar
# loop's compares branch on random activations; 5% of its b32 step).
MIN_VECTOR_EXTENT = 4
MAX_VECTOR_EXTENT = 64  # longer vector axes are split
REGISTER_FACTORS = (4, 3, 2)  # the unrolled register axis: the first factor that divides
# A read may step by this much along the vector axis (strided pooling and convolution):
# gcc still vectorizes the loop, with loads and permutes.
MAX_READ_STRIDE = 4


def tile_reductions(sch: s_tir.Schedule) -> None:
    for block in _blocks(sch):
        try:
            _tile_one(sch, block)
        except Exception:  # noqa: BLE001 - a block this schedule does not fit stays as is
            continue


def _blocks(sch):
    try:
        root = sch.get_sblock("root")
    except Exception:  # noqa: BLE001
        return []
    return list(sch.get_child_blocks(root))


def _uses(expr, var) -> bool:
    """Whether the index expression `expr` mentions `var`."""
    if isinstance(expr, ir.Var):
        return expr.same_as(var)
    return any(_uses(getattr(expr, f), var) for f in ("a", "b", "value", "condition",
                                                     "true_value", "false_value")
               if hasattr(expr, f) and getattr(expr, f) is not None) or \
        any(_uses(x, var) for x in (expr.args if isinstance(expr, ir.Call) else ()))


def _linear_coeff(expr, var):
    """The coefficient of `var` in the affine index `expr`; None where it is not affine."""
    if isinstance(expr, ir.Var):
        return 1 if expr.same_as(var) else 0
    if isinstance(expr, prim.IntImm):
        return 0
    if isinstance(expr, (prim.Add, prim.Sub)):
        a, b = _linear_coeff(expr.a, var), _linear_coeff(expr.b, var)
        if a is None or b is None:
            return None
        return a + b if isinstance(expr, prim.Add) else a - b
    if isinstance(expr, prim.Mul):
        for const, other in ((expr.a, expr.b), (expr.b, expr.a)):
            if isinstance(const, prim.IntImm):
                c = _linear_coeff(other, var)
                return None if c is None else int(const.value) * c
    return None if _uses(expr, var) else 0


def _tile_one(sch: s_tir.Schedule, block_rv) -> None:
    block = sch.get(block_rv)
    ivs = list(block.iter_vars)
    reduce_pos = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == 2]
    if not reduce_pos or block.init is None:
        return
    loops = sch.get_loops(block_rv)
    if len(loops) != len(ivs):
        return
    for loop_rv, iv in zip(loops, ivs):  # loops must bind the iterators one to one, in order
        if int(sch.get(loop_rv).extent) != int(iv.dom.extent):
            return
    spatial_pos = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == 0]
    if reduce_pos != list(range(len(spatial_pos), len(ivs))):
        return
    write = block.writes[0].source
    # int32 sums (the integer step's convs and matmuls) are exact in any order: tiled as
    # float32's are
    wide = str(write.dtype) not in ("float32", "int32")
    if wide or not spatial_pos:
        # float64 sums (BatchNorm statistics, bias gradients on hosts): partial sums across
        # the unit-stride innermost reduction vectorize where a single chain of adds cannot
        if not (wide and spatial_pos and
                _factor_dot_product(sch, block_rv, block, ivs, loops, reduce_pos)):
            sch.decompose_reduction(block_rv, loops[reduce_pos[0]])
        return
    v_pos = _vector_axis(block, ivs, spatial_pos)
    if v_pos is None:
        if not _factor_dot_product(sch, block_rv, block, ivs, loops, reduce_pos):
            sch.decompose_reduction(block_rv, loops[reduce_pos[0]])
        return
    u_pos = _register_axis(block, ivs, spatial_pos, v_pos)

    outer = [loops[i] for i in spatial_pos if i not in (v_pos, u_pos)]
    u = None if u_pos is None else (loops[u_pos], int(ivs[u_pos].dom.extent))
    _order(sch, block_rv, outer, u, (loops[v_pos], int(ivs[v_pos].dom.extent)),
           [loops[i] for i in reduce_pos])


def _order(sch, block_rv, outer, u, v, reduce_loops) -> None:
    """outer..., u_outer, v_outer, reduce..., v (vector), u_inner (unrolled); init hoisted."""
    v_loop, v_ext = v
    v_outer = []
    if v_ext > MAX_VECTOR_EXTENT and v_ext % VECTOR_ELEMENTS == 0:
        vo, v_loop = sch.split(v_loop, [None, VECTOR_ELEMENTS])
        v_outer = [vo]
    u_outer, u_inner = [], []
    if u is not None:
        u_loop, u_ext = u
        factor = next((f for f in REGISTER_FACTORS if u_ext % f == 0), 1)
        if factor > 1 and u_ext > factor:
            uo, ui = sch.split(u_loop, [None, factor])
            u_outer, u_inner = [uo], [ui]
        elif factor > 1:
            u_inner = [u_loop]
        else:
            u_outer = [u_loop]
    sch.reorder(*(outer + u_outer + v_outer + reduce_loops + [v_loop] + u_inner))
    for loop in u_inner:
        sch.unroll(loop)
    sch.decompose_reduction(block_rv, reduce_loops[0])


def _vector_axis(block, ivs, spatial_pos):
    """The last spatial iterator if it is unit-stride in the output's last dimension and in
    every read that uses it (else None)."""
    v = ivs[spatial_pos[-1]].var
    if int(ivs[spatial_pos[-1]].dom.extent) < MIN_VECTOR_EXTENT:
        return None
    write = block.writes[0]
    if not _unit_stride_last(write.region, v):
        return None
    for read in block.reads:
        region = read.region
        if not any(_uses(r.min, v) for r in region):
            continue
        if not _unit_stride_last(region, v, MAX_READ_STRIDE):
            return None
    return spatial_pos[-1]


def _unit_stride_last(region, v, max_stride: int = 1) -> bool:
    """v indexes only the last dimension, with a constant stride of 1 (up to max_stride)."""
    *rest, last = region
    if any(_uses(r.min, v) for r in rest):
        return False
    stride = _linear_coeff(last.min, v)
    return stride is not None and 1 <= stride <= max_stride


def _register_axis(block, ivs, spatial_pos, v_pos):
    """A spatial iterator (other than the vector one) that some read using the vector
    iterator does not depend on: unrolling it reuses that read's loaded vector."""
    v = ivs[v_pos].var
    vector_reads = [r for r in block.reads if any(_uses(x.min, v) for x in r.region)]
    if not vector_reads:
        return None
    candidates = []
    for i in reversed(spatial_pos):
        if i == v_pos or int(ivs[i].dom.extent) < 2:
            continue
        var = ivs[i].var
        if any(not any(_uses(x.min, var) for x in r.region) for r in vector_reads):
            candidates.append(i)
    for i in candidates:  # prefer one that a register factor divides
        if any(int(ivs[i].dom.extent) % f == 0 for f in REGISTER_FACTORS):
            return i
    return candidates[0] if candidates else None


def _factor_dot_product(sch, block_rv, block, ivs, loops, reduce_pos) -> bool:
    """A block whose output has no long unit-stride axis (the conv weight gradient: a 3x3
    output per channel pair, reduced over the whole feature map) but whose innermost
    reduction is unit-stride in every read: rfactor that reduction into a partial-sum axis,
    which then is the vector axis of the partial-sum block, and a short final sum.
    A long reduction gets partial sums even where a read is strided (gcc does not vectorise
    them then): one chain of float32 adds over hundreds of terms rounds several times worse
    than the blocked sums float32 PyTorch runs (fuzz seed 21134: a Linear(620, 2))."""
    r = ivs[reduce_pos[-1]]
    ext = int(r.dom.extent)
    if ext < VECTOR_ELEMENTS:
        return False
    strided = any(any(_uses(x.min, r.var) for x in read.region) and
                  not _unit_stride_last(read.region, r.var) for read in block.reads)
    if strided and ext <= MAX_VECTOR_EXTENT:
        return False
    loop = loops[reduce_pos[-1]]
    if str(block.writes[0].source.dtype) != "float32" and _whole_rows(block, ivs, reduce_pos):
        # float64 partials of float32 rows: gcc vectorises the widening adds over a plane
        # split in vectors, not over each row split in two loops. Same lanes (w % 8) and
        # order: bit-identical.
        loop = sch.fuse(loops[reduce_pos[-2]], loop)
        ext *= int(ivs[reduce_pos[-2]].dom.extent)
    if ext <= MAX_VECTOR_EXTENT and ext % VECTOR_ELEMENTS:
        inner = loop
    else:  # a long reduction not a multiple of 8: the last chunk is predicated (k < ext)
        _, inner = sch.split(loop, [None, VECTOR_ELEMENTS])
    spatial_pos = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == 0]
    spatial = len(spatial_pos)
    u_pos = _register_axis(block, ivs, spatial_pos, reduce_pos[-1])
    rf = sch.rfactor(inner, factor_axis=spatial)
    # The partial-sum block's loops: the spatial ones, the remaining reductions, and the
    # factored axis innermost (now spatial, unit-stride in every read and in the partials).
    rf_loops = sch.get_loops(rf)
    u = None if u_pos is None else (rf_loops[u_pos], int(ivs[u_pos].dom.extent))
    outer = [rf_loops[i] for i in range(spatial) if i != u_pos]
    v_ext = int(sch.get(rf_loops[-1]).extent)
    _order(sch, rf, outer, u, (rf_loops[-1], v_ext), list(rf_loops[spatial:-1]))
    final_loops = sch.get_loops(block_rv)
    sch.decompose_reduction(block_rv, final_loops[spatial])
    return True


def _whole_rows(block, ivs, reduce_pos) -> bool:
    """The last two reductions run over whole rows of every read they index (x[.., h, w]
    with the row's full width): the plane they cover is contiguous, one loop can run it."""
    if len(reduce_pos) < 2:
        return False
    h, w = ivs[reduce_pos[-2]], ivs[reduce_pos[-1]]
    if w.dom.extent.value % VECTOR_ELEMENTS:
        return False
    for read in block.reads:
        region = read.region
        if not any(_uses(r.min, h.var) or _uses(r.min, w.var) for r in region):
            continue
        if len(region) < 2 or not region[-2].min.same_as(h.var) or \
                not region[-1].min.same_as(w.var) or \
                int(read.source.shape[-1]) != int(w.dom.extent) or \
                any(_uses(r.min, h.var) or _uses(r.min, w.var) for r in region[:-2]):
            return False
    return True
