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
switches to a variant of the same kernel that reads `a` through `out`'s pointer (the
mechanism the optimizer update uses): one base pointer, so C's vectoriser sees element-wise
dependences only, where two unrelated pointers that may overlap would keep the loop scalar.
ReLU and its backward mask, residual adds, `where` and `multiply` in the backward, and
BatchNorm's elementwise steps qualify; convolutions and reductions do not.
"""

from __future__ import annotations

from ..kernels.tir_access import in_place_pairs
from .ir import Call, Program, Slot, users

SHAREABLE_KINDS = ("activation", "gradient", "mask")


def take_dying_buffer(calls: list[Call], at: int, src: Slot, dst: Slot) -> None:
    """Make `dst` a view of `src` where `src`, a transient buffer, dies at call `at` and
    `dst`, a fresh transient of the same size, may take its storage: for fused kernels that
    the analysis below cannot read (no TIR) but that read each element before writing it."""
    if (src.root.kind in SHAREABLE_KINDS and dst.view_of is None and dst.kind in SHAREABLE_KINDS
            and dst.nbytes == src.root.nbytes and users(calls, src)[-1] <= at):
        dst.view_of, dst.in_place = src, True


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
        aliases: dict[int, int] = {}  # input index -> the output written over it
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
            aliases.update((j, o) for j in same)
            shared += dst.nbytes
        if aliases:
            call.kernel = library.in_place_variant(call.kernel, aliases).name
    return shared
