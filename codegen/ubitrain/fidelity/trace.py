"""Which kernel call of a step computes something else than its own TIR?

A debugging aid for a mismatch the referee reports. The model is compiled with a hook after
every call of the step (the pipeline's CallTrace instrument) and trained one step; after
each call the arena is read back, and the call's PrimFunc, built for the host by TVM's LLVM backend,
runs on the inputs the call read. A call whose output differs is where the C (the printer,
a micro-kernel, an in-place rewrite, the memory plan) departs from the program; when every
call agrees, the program itself (the graph, a gradient rule) departs from PyTorch.

    from ubitrain.fidelity.trace import check_calls
    for mismatch in check_calls(model, (x,), y, optimizer=ub.SGD(lr=0.1)):
        print(mismatch)
"""

from __future__ import annotations

import ctypes
import tempfile
from dataclasses import dataclass

import numpy as np
import tvm

from .. import api
from ..pipeline import CallTrace


@dataclass
class CallMismatch:
    index: int
    kernel: str
    output: str
    error: float  # max |C - TIR| / max |TIR|

    def __str__(self):
        return (f"call {self.index} {self.kernel}: output {self.output} is {self.error:.2e} "
                "from its PrimFunc")


def _value(slot, arena, plan, batch):
    root = slot.root
    if root.kind == "constant":
        data = np.asarray(root.value).reshape(-1).view(np.uint8)
    elif root.external:
        data = np.ascontiguousarray(batch[root.name]).reshape(-1).view(np.uint8)
    else:
        data = arena[plan.offsets[root]:]
    start = slot.root_offset
    return data[start:start + slot.nbytes].view(slot.dtype).reshape(slot.shape).copy()


def _prim_func(library, kernel):
    func = library.prim_func(kernel)
    if func is None:  # an in-place variant: its base kernel's PrimFunc
        base = next((b for (b, _), v in library._variants.items() if v == kernel and b != kernel),
                    None)
        func = library.prim_func(base) if base else None
    return func


def check_calls(model, example_inputs, labels, tolerance: float = 1e-5, **compile_options):
    """The train_step calls of `model` (one step on the example batch) whose outputs differ
    from their PrimFunc's by more than `tolerance`; calls without a PrimFunc (runtime builtins,
    fused templates) are not checked."""
    trace = CallTrace()
    with tempfile.TemporaryDirectory() as tmp:
        pkg = api.compile(model, example_inputs, labels, out_dir=tmp, instruments=[trace],
                          **compile_options)
        trainer = pkg.build(arena_fill=0xFF)
        library, plan = trace.library, pkg.memory_plan
        calls = pkg.programs["train_step"].calls
        snapshots = {-1: trainer.arena.copy()}

        def hook(program, index, arena):
            if program == 0:
                snapshots[index] = np.ctypeslib.as_array(
                    (ctypes.c_uint8 * plan.arena_bytes).from_address(arena)).copy()

        callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)(hook)
        ctypes.c_void_p.in_dll(trainer.lib, f"ub_{pkg.model_name}_trace").value = \
            ctypes.cast(callback, ctypes.c_void_p).value
        xs = [np.asarray(x) for x in example_inputs]
        trainer.step(*xs, np.asarray(labels))
        batch = {s.name: x for s, x in zip(pkg.inputs, xs)}
        batch["labels"] = np.asarray(labels).astype(pkg.labels.dtype)
        mismatches, built = [], {}
        for i, call in enumerate(calls):
            func = None if call.builtin else _prim_func(library, call.kernel)
            if func is None:
                continue
            if call.kernel not in built:
                built[call.kernel] = tvm.compile(func.with_attr("global_symbol", "main"),
                                                 target={"kind": "llvm"})
            shapes = [[int(d) for d in p.shape] for p in func.params]
            args = [tvm.runtime.tensor(np.zeros(shape, a.dtype) if k in call.outputs else
                                       _value(a, snapshots[i - 1], plan, batch).reshape(shape))
                    for k, (a, shape) in enumerate(zip(call.args, shapes))]
            built[call.kernel]["main"](*args)
            for k in call.outputs:
                want = args[k].numpy().astype(np.float64).reshape(-1)
                got = _value(call.args[k], snapshots[i], plan, batch).astype(np.float64)
                got = got.reshape(-1)
                same = (got == want) | (np.isnan(got) & np.isnan(want))
                diff = np.where(same, 0.0, np.abs(got - want))
                scale = float(np.max(np.abs(np.nan_to_num(want)), initial=0.0))
                error = float(np.max(np.nan_to_num(diff, nan=np.inf), initial=0.0)) / max(
                    scale, 1e-30)
                if not error <= tolerance:
                    mismatches.append(CallMismatch(i, call.kernel, call.args[k].name, error))
    return mismatches
