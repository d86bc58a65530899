"""The optimizer update in the epilogue of a Linear layer's weight-gradient GEMM.

After the early placement (program/build.py), a weight's update runs right after the kernel
that finishes its gradient, but the whole gradient still goes through the arena: for
LeNet-5's fc1, 192,000 bytes written by the GEMM and read back by the update. Where that
kernel is a matmul micro-kernel (dW = dY^T . X) and the gradient has no other reader, the
two calls become one kernel (templates/common/matmul_update.c.j2) that computes the
gradient a block of rows at a time in its scratch and updates those rows of the weight and
its optimizer state at once. Each gradient element is the same dot product and each update
the same element rule as before, so the step is bit-identical (tests/test_update_epilogue.py).

Convolution weight gradients keep their separate update: they accumulate over the batch
image by image, so no block of their gradient is final before the last image.
"""

from __future__ import annotations

import math

from ..kernels import microkernels
from ..kernels.c_printer import CKernel
from ..kernels.microkernels.manifest import core_names
from ..kernels.microkernels.render import render_template
from .ir import Call, Slot, users

BLOCK_BYTES = 16 * 1024  # one block of gradient rows stays in L1


def fuse_update_epilogues(calls: list[Call], library, update_kernel) -> list[Call]:
    """`calls` with each (matmul weight gradient, its update) pair fused; `update_kernel(n)`
    adds the update kernel for n elements to `library` and returns it."""
    out = []
    for call in calls:
        prev = out[-1] if out else None
        fused = _fuse(prev, call, calls, library, update_kernel) if prev else None
        if fused is None:
            out.append(call)
        else:
            out[-1] = fused
    return out


def _fuse(grad_call: Call, update: Call, calls, library, update_kernel) -> Call | None:
    if "param" not in update.attrs or grad_call.builtin:
        return None
    grad = update.args[1]
    if [w.root for w in grad_call.writes] != [grad.root] or grad is not grad.root:
        return None
    if len(users(calls, grad)) != 2:
        return None  # another kernel reads the gradient
    func = library.prim_func(grad_call.kernel)
    planned = microkernels.plan(func, library.isa) if func is not None else None
    if planned is None or planned[0] != "matmul" or planned[2].get("mode") is not None:
        return None
    p = planned[2]
    M, N, K = p["M"], p["N"], p["K"]
    rows = max(1, min(M, BLOCK_BYTES // (4 * N)))
    block = update_kernel(rows * N)
    tail = update_kernel(M % rows * N) if M % rows else None
    n_states = (len(update.args) - 3) // 2  # [param, grad] + states + [coef, param] + states
    states = [f"state{i}" for i in range(n_states)]
    g_bytes = (4 * rows * N + 15) // 16 * 16
    name = library.microkernel_name("matmul_update")
    source = render_template("common/matmul_update.c.j2", name=name, M=M, N=N, K=K, R=rows,
                             states=states, block=block.name, tail=tail and tail.name,
                             g_bytes=g_bytes, **core_names(library.isa))
    a, b = grad_call.args[0], grad_call.args[1]
    param, coef = update.args[0], update.args[2 + n_states]
    state_slots = update.args[2:2 + n_states]
    params = [("in0", "float32", M * K), ("in1", "float32", K * N),
              ("param", "float32", M * N)] + [(s, "float32", M * N) for s in states] + \
        [("coef", "float32", math.prod(coef.shape))]
    scratch = g_bytes + max(block.scratch_bytes, tail.scratch_bytes if tail else 0)
    library.add_rendered(CKernel(name=name, source=source, params=params,
                                 written=set(range(2, 3 + n_states)), scratch_bytes=scratch,
                                 notes=["matmul weight gradient + optimizer update"]))
    return Call(name, [a, b, param] + state_slots + [coef], list(range(2, 3 + n_states)),
                attrs=dict(update.attrs),
                scratch=Slot(f"scratch_{name}", (scratch,), "uint8", "scratch"))
