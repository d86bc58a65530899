"""What a lowered kernel reads and writes, element by element: the facts that decide when two
buffers may share memory.

`Access` lists every store and load of a lowered PrimFunc with the loops around it, in program
order. Storage is named by a key: the parameter's index for a parameter (and its 1-D views),
`("alloc", k)` for the k-th buffer the kernel allocates. Two users:

  * in-place sharing between kernels (program/inplace.py): an output may overwrite an input;
  * output reuse inside a fused kernel (`output_reuse`): a conv/matmul fused with its
    elementwise epilogue (lowering/fusion.py) computes into an internal buffer and then writes
    `out[i] = f(tmp[i], ...)`; `tmp` may then live in `out` itself, so fusion costs no
    scratch memory. The C printer gives `tmp` the output's pointer.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, prim, tirx


class UnknownTir(Exception):
    """The analysis met a node it does not model; no buffer may be shared."""


_LEAVES = (prim.IntImm, prim.FloatImm, ir.Var, ir.StringImm)


def operands(e) -> list:
    """The subexpressions of a scalar TIR expression (a load's: its indices); UnknownTir for
    a node this module does not model (vectors, Let)."""
    if isinstance(e, _LEAVES):
        return []
    if isinstance(e, ir.TensorLoad):
        return list(e.indices)
    if isinstance(e, ir.Call):
        return list(e.args)
    if isinstance(e, prim.Select):
        return [e.condition, e.true_value, e.false_value]
    if isinstance(e, prim.Cast):
        return [e.value]
    if isinstance(e, prim.Not):
        return [e.a]
    if hasattr(e, "a") and hasattr(e, "b"):  # arithmetic, comparison, logic
        return [e.a, e.b]
    raise UnknownTir(type(e).__name__)


class Access:
    """Every store and load of a lowered PrimFunc, with the loops around each store.

    stores: (key, indices, loops, conditional, store id, order)
    loads:  (key, indices, store id whose value holds the load or None, order)
    `order` counts accesses in program order (a store's loads come before the store);
    `nest[order]` is the outermost loop variable around that access (None outside loops)."""

    def __init__(self, func: tirx.PrimFunc):
        # buffer (or its 1-D view) -> key; TVM's Python wrappers are not unique objects, so
        # storage is compared by key, never with `is`.
        self.alias: dict = {p: i for i, p in enumerate(func.params)}
        self.stores: list[tuple] = []
        self.loads: list[tuple] = []
        self.allocs: dict = {}  # key -> the allocated buffer
        self.nest: dict[int, object] = {}
        self.outer = None  # the outermost loop variable where the traversal is
        self.order = 0
        self.stmt(func.body, [], False)

    def key(self, buffer):
        return self.alias.get(buffer)

    def tick(self) -> int:
        self.order += 1
        self.nest[self.order] = self.outer
        return self.order

    def expr(self, e, within):
        for child in operands(e):
            self.expr(child, within)
        if isinstance(e, ir.TensorLoad):
            self.loads.append((self.key(e.source), list(e.indices), within, self.tick()))

    def stmt(self, s, loops, conditional):
        t = type(s)
        if t is tirx.SeqStmt:
            for child in s.seq:
                self.stmt(child, loops, conditional)
        elif t is tirx.For:
            self.expr(s.min, None)
            self.expr(s.extent, None)
            if not loops:
                self.outer = s.loop_var
            self.stmt(s.body, loops + [(s.loop_var, s.min, s.extent)], conditional)
            if not loops:
                self.outer = None
        elif t is tirx.BufferStore:
            sid = len(self.stores)
            for i in s.indices:
                self.expr(i, None)
            self.expr(s.value, sid)
            self.stores.append((self.key(s.buffer), list(s.indices), loops, conditional, sid,
                                self.tick()))
        elif t is tirx.IfThenElse:
            self.expr(s.condition, None)
            self.stmt(s.then_case, loops, True)
            if s.else_case is not None:
                self.stmt(s.else_case, loops, True)
        elif t is tirx.Bind:
            self.expr(s.value, None)
        elif t is tirx.DeclBuffer:
            root = s.data.args[0] if isinstance(s.data, ir.Call) and s.data.args else None
            self.alias[s.buffer] = self.alias.get(root)
        elif t is tirx.AllocBuffer:
            k = ("alloc", len(self.allocs))
            self.alias[s.buffer] = k
            self.allocs[k] = s.buffer
        elif t is tirx.AttrStmt:
            self.stmt(s.body, loops, conditional)
        elif t is tirx.Evaluate:
            self.expr(s.value, None)
        elif t is tirx.AssertStmt:
            pass
        else:
            raise UnknownTir(t.__name__)
        body = getattr(s, "body", None)
        if t in (tirx.AllocBuffer, tirx.DeclBuffer) and body is not None:
            self.stmt(body, loops, conditional)


def tensor_loads(e) -> list:
    """Every TensorLoad in expression `e` (loads in its indices too); UnknownTir for a node
    the analysis does not model."""
    if isinstance(e, _LEAVES):
        return []
    if isinstance(e, ir.TensorLoad):
        return [e] + [x for i in e.indices for x in tensor_loads(i)]
    if hasattr(e, "a") and hasattr(e, "b"):
        return tensor_loads(e.a) + tensor_loads(e.b)
    if isinstance(e, prim.Not):
        return tensor_loads(e.a)
    if isinstance(e, prim.Cast):
        return tensor_loads(e.value)
    if isinstance(e, prim.Select):
        return [x for c in (e.condition, e.true_value, e.false_value) for x in tensor_loads(c)]
    if isinstance(e, ir.Call):
        return [x for a in e.args for x in tensor_loads(a)]
    raise UnknownTir(type(e).__name__)


def elements(buffer) -> int:
    n = 1
    for d in buffer.shape:
        n *= int(d)
    return n


def one_to_one(indices, loops) -> bool:
    """The store index visits every point of the loop nest at a different element."""
    if len(indices) != 1 or not loops:
        return False
    try:
        iters = {v: ir.Range.from_min_extent(lo, ext) for v, lo, ext in loops}
        result = tvm.sym.detect_iter_map(indices, iters, check_level="bijective")
    except Exception:  # anything TVM cannot map is simply not shared
        return False
    return len(result.indices) == 1


def in_place_pairs(func: tirx.PrimFunc, earlier_reads: bool = True) -> list[tuple[int, int]]:
    """(input index, output index) of every parameter pair that may share storage.

    With `earlier_reads`, the input may also be read in loop nests that end before the
    output's nest starts (a fused kernel's reductions, e.g. BatchNorm's statistics), unless
    the output already holds an internal buffer there (`output_reuse`)."""
    try:
        acc = Access(func)
    except UnknownTir:
        return []
    strict = _pairs(acc, list(func.params), False)
    if not earlier_reads:
        return strict
    holds_tmp = set(_output_reuse(acc, list(func.params), strict).values())
    return [(k, o) for k, o in _pairs(acc, list(func.params), True) if o not in holds_tmp]


def _pairs(acc: Access, params, earlier_reads: bool) -> list[tuple[int, int]]:
    stored = {p for p, *_ in acc.stores}
    loaded = {p for p, *_ in acc.loads}
    pairs = []
    for o, out in enumerate(params):
        if o not in stored or o in loaded:
            continue
        stores = [s for s in acc.stores if s[0] == o]
        if len(stores) != 1:
            continue
        _, index, loops, conditional, sid, order = stores[0]
        if conditional or not one_to_one(index, loops):
            continue
        start = _nest_start(acc, order) if earlier_reads else 0
        for k, inp in enumerate(params):
            if k == o or k in stored or str(inp.dtype) != str(out.dtype) or \
                    elements(inp) != elements(out):
                continue
            uses = [(idx, within) for p, idx, within, t in acc.loads if p == k and t >= start]
            if uses and all(within == sid and tvm_ffi.structural_equal(idx, index)
                            for idx, within in uses):
                pairs.append((k, o))
    return pairs


def _nest_start(acc: Access, order: int) -> int:
    """The order of the first access in the outermost loop nest around access `order`."""
    outer = acc.nest[order]
    return min(t for t, v in acc.nest.items() if _same(v, outer)) if outer is not None else 0


def output_reuse(func: tirx.PrimFunc) -> dict:
    """{allocated buffer: output parameter index} for every internal buffer that may live in
    an output. `out` qualifies with `tmp` (same dtype and size) when `out` is never loaded and
    stored exactly once, unconditionally and one element per iteration, as `out[i] = f(tmp[i],
    ...)`; and `tmp` is not touched from the start of that store's loop nest on except by
    those loads. Then every element of `tmp` is read once, at the iteration that overwrites
    it, after all the kernel's other work with `tmp` is done. An output that may instead
    overwrite a dying input (`in_place_pairs`) keeps `tmp` in scratch: sharing with the input
    saves the same bytes and leaves the choice to the program (program/inplace.py)."""
    try:
        acc = Access(func)
    except UnknownTir:
        return {}
    params = list(func.params)
    return _output_reuse(acc, params, _pairs(acc, params, False))


def _output_reuse(acc: Access, params, pairs) -> dict:
    reuse = {}
    loaded = {k for k, *_ in acc.loads}
    may_share = {o for _, o in pairs}
    for o, out in enumerate(params):
        stores = [s for s in acc.stores if s[0] == o]
        if o in loaded or o in may_share or len(stores) != 1:
            continue
        _, index, loops, conditional, sid, _ = stores[0]
        if conditional or not one_to_one(index, loops):
            continue
        last = stores[0][5]
        outer = acc.nest[last]
        for key, tmp in acc.allocs.items():
            if tmp in reuse or str(tmp.dtype) != str(out.dtype) or elements(tmp) != elements(out):
                continue
            in_nest = [(idx, within) for k, idx, within, order in acc.loads
                       if k == key and _same(acc.nest[order], outer)]
            stored_in_nest = any(s[0] == key and _same(acc.nest[s[5]], outer)
                                 for s in acc.stores)
            after = any(k == key and order > last for k, *_, order in acc.loads + acc.stores)
            if in_nest and not stored_in_nest and not after and all(
                    within == sid and tvm_ffi.structural_equal(idx, index)
                    for idx, within in in_nest):
                reuse[tmp] = o
                break
    return reuse



def _same(a, b) -> bool:
    return a is not None and b is not None and a.same_as(b)
