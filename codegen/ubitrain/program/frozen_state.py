"""Frozen state as constants: on a microcontroller, weights that no step writes stay in flash.

With a sparse update (training/sparse_update.py) or `trainable=[...]`, most weights never
change. Copying them into the arena at init would spend SRAM, the scarcest memory of a
board, on bytes that are only ever read. A state slot that no call of any program writes
becomes a constant of the graph instead: the project prints it as a `static const` array,
which the linker keeps in flash (.rodata), and the memory plan gives it no arena bytes.
Buffers that a training step updates (BatchNorm running statistics) and weights of which a
part trains (channel splits: the trained rows are written through a view of the whole
weight) are written, so they stay in the arena.

A kernel that reads frozen weights only (the transpose of a frozen Linear weight, which
the forward pass would otherwise rebuild in SRAM every step) computes the same value every
step: it is evaluated once at compile time (TVM's LLVM build of the same PrimFunc) and its
result becomes a constant in flash too.
"""

from __future__ import annotations

import numpy as np
import tvm

from ..errors import CompileError
from .ir import TRANSIENT_KINDS, Program, Slot


def keep_frozen_state_in_flash(programs: list[Program], state: dict[str, Slot]) -> dict[str, str]:
    """Turn every state slot that no call writes into a constant; {state name: its kind
    before ("parameter" or "buffer")}, which the tensor table still reports."""
    written = {id(slot.root) for prog in programs for call in prog.calls
               for slot in call.writes}
    frozen = {}
    for name, slot in state.items():
        if id(slot) not in written and slot.view_of is None:
            frozen[name] = slot.kind
            slot.kind = "constant"  # slot.value holds the weights: the constant's data
    return frozen


def fold_frozen_calls(programs: list[Program], library) -> int:
    """Evaluate every kernel call whose inputs are all constants and replace its outputs by
    constants; the bytes of the new constants (one copy where programs share a value)."""
    written_by: dict[int, int] = {}
    for prog in programs:
        for call in prog.calls:
            for slot in call.writes:
                written_by[id(slot.root)] = written_by.get(id(slot.root), 0) + 1
    folded: dict[tuple, list[Slot]] = {}  # (kernel, input roots) -> constants it gave
    new_bytes = 0
    for prog in programs:
        kept = []
        for call in prog.calls:
            # a call's scratch is the PrimFunc's own allocation, which the host build makes itself
            func = None if call.builtin else library.prim_func(call.kernel)
            if func is None or not _foldable(call, written_by):
                kept.append(call)
                continue
            key = (call.kernel, tuple(id(a.root) for a in call.reads))
            if key in folded:  # predict computes what train_step did: share the constant
                for out, known in zip(call.writes, folded[key]):
                    out.kind, out.view_of = "constant", known
                continue
            for out, value in zip(call.writes, _evaluate(func, call)):
                out.kind, out.value = "constant", value
                new_bytes += out.nbytes
            folded[key] = call.writes
        prog.calls[:] = kept
    return new_bytes


def _foldable(call, written_by) -> bool:
    return (all(a.root.kind == "constant" for a in call.reads)
            and all(w.view_of is None and w.kind in TRANSIENT_KINDS
                    and written_by[id(w)] == 1 for w in call.writes))


def _evaluate(func, call) -> list[np.ndarray]:
    """Run the kernel's PrimFunc on the host (LLVM) over the call's constant inputs."""
    try:
        run = tvm.compile(func.with_attr("global_symbol", "main"), target={"kind": "llvm"})
        args = [tvm.runtime.tensor(np.ascontiguousarray(_value(a)).astype(a.dtype))
                if i not in call.outputs else tvm.runtime.tensor(np.zeros(a.shape, a.dtype))
                for i, a in enumerate(call.args)]
        run["main"](*args)
    except Exception as err:  # noqa: BLE001 - TVM raises many kinds; name the kernel
        raise CompileError(f"evaluating kernel {call.kernel} over frozen weights at compile "
                           f"time failed: {err}; compile for a target without "
                           "frozen_state_in_flash to keep it a runtime kernel") from None
    return [args[i].numpy() for i in call.outputs]


def _value(slot: Slot) -> np.ndarray:
    """A constant slot's value in its own shape (a reshape view reads its root's bytes)."""
    root = slot.root
    flat = np.asarray(root.value).reshape(-1).view(np.uint8)
    start = slot.root_offset
    return flat[start:start + slot.nbytes].view(slot.dtype).reshape(slot.shape)
