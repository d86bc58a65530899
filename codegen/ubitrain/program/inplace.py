"""In-place sharing: an elementwise kernel's output takes the buffer of an input that dies there.

A call `out = f(a, b, ...)` may write `out` over `a` when
  * `a` is a transient buffer (activation, gradient, mask) whose last use is this call,
  * `out` is a fresh transient buffer with the same dtype and byte size, and
  * the kernel reads every element of `a` only to compute the element of `out` at the same
    index, before it writes that element.

The last condition is decided from the lowered TIR of the kernel, never from op names:
`out` is stored exactly once, unconditionally, at an index that is a bijective affine map of
the loops around the store (`tvm.sym.detect_iter_map`, so each element is written once);
every load of `a` (through any parameter bound to `a`'s storage) sits inside the value of that
store with a structurally identical index; and `out` is never loaded. Such a kernel computes
`out[i] = g(a[i], ...)`, and C evaluates the value before the assignment, so `out` may alias
`a`. Anything the analysis does not understand (vector lanes, Let, conditional stores)
disqualifies the pair.

An accepted call makes `out` a view of `a` (it shares `a`'s storage, so `a`'s lifetime
extends to `out`'s last use, and later calls may chain further in-place writes), and the call
switches to a variant of the same kernel printed without `restrict` (the mechanism the
optimizer update uses). ReLU and its backward mask, residual adds, `where` and `multiply` in
the backward, and BatchNorm's elementwise steps qualify; convolutions and reductions do not.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import ir, prim, tirx

from .ir import Program, Slot

SHAREABLE_KINDS = ("activation", "gradient", "mask")


class _Unknown(Exception):
    """The analysis met a node it does not model; the kernel gets no in-place pairs."""


_LEAVES = (prim.IntImm, prim.FloatImm, ir.Var, ir.StringImm)


class _Access:
    """Every store and load of a lowered PrimFunc, with the loops around each store."""

    def __init__(self, func: tirx.PrimFunc):
        # buffer (or its 1-D view) -> parameter index; TVM's Python wrappers are not unique
        # objects, so parameters are compared by index, never with `is`.
        self.alias: dict = {p: i for i, p in enumerate(func.params)}
        self.stores: list[tuple] = []  # (param index, indices, loops, conditional, store id)
        self.loads: list[tuple] = []  # (param index, indices, store id or None)
        self.stmt(func.body, [], False)

    def param(self, buffer):
        return self.alias.get(buffer)

    def expr(self, e, within):
        if isinstance(e, _LEAVES):
            return
        if isinstance(e, ir.TensorLoad):
            self.loads.append((self.param(e.source), list(e.indices), within))
            for i in e.indices:
                self.expr(i, within)
        elif isinstance(e, (prim.Ramp, prim.Broadcast, prim.Shuffle, prim.Let)):
            raise _Unknown(type(e).__name__)
        elif hasattr(e, "a") and hasattr(e, "b"):
            self.expr(e.a, within)
            self.expr(e.b, within)
        elif isinstance(e, prim.Not):
            self.expr(e.a, within)
        elif isinstance(e, prim.Cast):
            self.expr(e.value, within)
        elif isinstance(e, prim.Select):
            for x in (e.condition, e.true_value, e.false_value):
                self.expr(x, within)
        elif isinstance(e, ir.Call):
            for a in e.args:
                self.expr(a, within)
        else:
            raise _Unknown(type(e).__name__)

    def stmt(self, s, loops, conditional):
        t = type(s)
        if t is tirx.SeqStmt:
            for child in s.seq:
                self.stmt(child, loops, conditional)
        elif t is tirx.For:
            self.expr(s.min, None)
            self.expr(s.extent, None)
            self.stmt(s.body, loops + [(s.loop_var, s.min, s.extent)], conditional)
        elif t is tirx.BufferStore:
            sid = len(self.stores)
            self.stores.append((self.param(s.buffer), list(s.indices), loops, conditional, sid))
            for i in s.indices:
                self.expr(i, None)
            self.expr(s.value, sid)
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
        elif t is tirx.AttrStmt:
            self.stmt(s.body, loops, conditional)
        elif t is tirx.Evaluate:
            self.expr(s.value, None)
        elif t in (tirx.AllocBuffer, tirx.AssertStmt):
            pass
        else:
            raise _Unknown(t.__name__)
        body = getattr(s, "body", None)
        if t in (tirx.AllocBuffer, tirx.DeclBuffer) and body is not None:
            self.stmt(body, loops, conditional)


def _elements(buffer) -> int:
    n = 1
    for d in buffer.shape:
        n *= int(d)
    return n


def _one_to_one(indices, loops) -> bool:
    """The store index visits every point of the loop nest at a different element."""
    if len(indices) != 1 or not loops:
        return False
    try:
        iters = {v: ir.Range.from_min_extent(lo, ext) for v, lo, ext in loops}
        result = tvm.sym.detect_iter_map(indices, iters, check_level="bijective")
    except Exception:  # anything TVM cannot map is simply not in place
        return False
    return len(result.indices) == 1


def in_place_pairs(func: tirx.PrimFunc) -> list[tuple[int, int]]:
    """(input index, output index) of every parameter pair that may share storage."""
    try:
        acc = _Access(func)
    except _Unknown:
        return []
    params = list(func.params)
    stored = {p for p, *_ in acc.stores}
    loaded = {p for p, _, _ in acc.loads}
    pairs = []
    for o, out in enumerate(params):
        if o not in stored or o in loaded:
            continue
        stores = [s for s in acc.stores if s[0] == o]
        if len(stores) != 1:
            continue
        _, index, loops, conditional, sid = stores[0]
        if conditional or not _one_to_one(index, loops):
            continue
        for k, inp in enumerate(params):
            if k == o or k in stored or str(inp.dtype) != str(out.dtype) or \
                    _elements(inp) != _elements(out):
                continue
            uses = [(idx, within) for p, idx, within in acc.loads if p == k]
            if uses and all(within == sid and tvm_ffi.structural_equal(idx, index)
                            for idx, within in uses):
                pairs.append((k, o))
    return pairs


def share_in_place(program: Program, library) -> int:
    """Make eligible outputs views of the inputs they overwrite; return the bytes shared."""
    last: dict[Slot, int] = {}
    first: dict[Slot, int] = {}
    for i, call in enumerate(program.calls):
        for s in call.args + ([call.scratch] if call.scratch else []):
            last[s.root] = i
            first.setdefault(s.root, i)
    pairs_of: dict[str, list[tuple[int, int]]] = {}
    shared = 0
    for i, call in enumerate(program.calls):
        if call.builtin or call.kernel not in library.lowered:
            continue
        if call.kernel not in pairs_of:
            pairs_of[call.kernel] = in_place_pairs(library.lowered[call.kernel])
        taken: set[int] = set()
        for k, o in pairs_of[call.kernel]:
            src, dst = call.args[k], call.args[o]
            root = src.root
            if (k in taken or o in taken or root.kind not in SHAREABLE_KINDS
                    or dst.view_of is not None or dst.kind not in SHAREABLE_KINDS
                    or last[root] != i or first.get(dst) != i
                    or dst.dtype != root.dtype or dst.nbytes != root.nbytes):
                continue
            # Every parameter bound to the same storage must itself be a valid pair with `o`.
            same = [j for j, a in enumerate(call.args) if a.root is root]
            if any(j in call.outputs or (j, o) not in pairs_of[call.kernel] for j in same):
                continue
            if any(j != o and a is dst for j, a in enumerate(call.args)):
                continue
            dst.view_of, dst.in_place = src, True
            last[root] = last.pop(dst)
            taken.update((k, o))
            shared += dst.nbytes
        if taken:
            call.kernel = library.in_place_variant(call.kernel).name
    return shared
