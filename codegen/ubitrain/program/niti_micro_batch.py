"""The int8 (NITI) step's gradient accumulators over k micro-batches: each trained parameter's
int32 gradients added at the coarsest exponent seen so far (niti/micro_batches.py), the
sum in an int32 accumulator, its exponent in an int32 one beside it.

The training function of a micro-batched int8 step returns each gradient with its exponent
(training/niti_graph.py); the loop (program/micro_batch.py loop_calls) adds both into the
accumulators after their last use, and the NITI update reads the sum, whose exponent it
does not need.
"""

from __future__ import annotations

import numpy as np
from tvm import te

from ..lowering.niti_kernels import niti_accumulate
from ..niti.micro_batches import EMPTY
from .ir import Call, Slot
from .micro_batch import ZERO


def aligned_sums(grads: list, library, scale: Slot):
    """`loop_calls`'s `sums` for (gradient, exponent) pairs: (the int32 accumulators, their
    zeroing and the exponents set to EMPTY before the loop, one aligned add per gradient).
    The float mean's `scale` has no place in the integer sum."""
    empty = Slot("niti_empty_exponent", (1,), "int32", "constant", np.array([EMPTY], np.int32))
    accs, inits, adds = [], [], []
    for grad, exponent in grads:
        acc = Slot(f"{grad.root.name}_acc", grad.shape, grad.dtype, "accumulator")
        acc_e = Slot(f"{grad.root.name}_acc_exponent", (1,), "int32", "accumulator")
        accs.append(acc)
        inits += [Call(ZERO, [acc], [0], builtin=True),
                  Call("ub_copy", [empty, acc_e], [1], builtin=True)]
        adds.append(_aligned_add(acc, acc_e, grad, exponent, library))
    return accs, inits, adds


def _aligned_add(acc: Slot, acc_e: Slot, grad: Slot, exponent: Slot, library) -> Call:
    """(acc, acc_e) += grad at `exponent`, in place."""
    a = te.placeholder(acc.shape, "int32", "acc")
    ea = te.placeholder((1,), "int32", "acc_exponent")
    g = te.placeholder(grad.shape, "int32", "grad")
    eg = te.placeholder((1,), "int32", "grad_exponent")
    total, e = niti_accumulate(a, ea, g, eg)
    kernel = library.add(te.create_prim_func([a, ea, g, eg, total, e]), "niti_accumulate",
                         {0: 4, 1: 5})
    scratch = Slot(f"scratch_{acc.name}", (kernel.scratch_bytes,), "uint8", "scratch") \
        if kernel.scratch_bytes else None  # the exponents' gap, kept apart (its docstring)
    return Call(kernel.name, [acc, acc_e, grad, exponent, acc, acc_e], sorted(kernel.written),
                scratch=scratch)
