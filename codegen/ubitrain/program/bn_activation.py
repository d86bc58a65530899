"""BatchNorm's backward with the gradient mask of the ReLU or clamp after it taken in.

A BatchNorm -> ReLU6 block's backward runs `dy = where(0 < z && z < 6, dz, 0)` (z the
activation's output, dz its gradient: one pass that reads two tensors and writes a third)
and then BatchNorm's backward, which reads dy and x twice (its sums, then dx). Where that
backward is a micro-kernel (templates/common/batch_norm.c.j2), the two calls become one that
reads dz and z in place of dy and masks as it goes: the mask's pass and its tensor are gone.
dy's elements are the same numbers, added in the same order, so the step is bit-identical
(tests/test_bn_activation.py).

dz now lives until the backward, where it had died at the mask (whose output took z's
buffer): the arena may hold one more tensor of that size there.
"""

from __future__ import annotations

from ..kernels import microkernels
from ..kernels.microkernels.match import c_float
from .activation_grads import gradient_mask, is_zero
from .inplace import take_dying_buffer
from .ir import Call, merge_feeders, users

DY = 4  # BatchNorm backward's arguments: x, gamma, mean, rstd, dy, then dx, dgamma, dbeta


def fuse_bn_activation_grads(calls: list[Call], library) -> list[Call]:
    """`calls` with each (activation gradient mask, BatchNorm backward) pair as one call."""
    fused: dict[tuple, str] = {}  # (backward kernel, lo, hi) -> its masked kernel

    def merge(i):
        found = _masked_backward(calls, i, library)
        if found is None:
            return None
        call, (at, mask) = calls[i], found
        z, dz = calls[at].args[mask.z], calls[at].args[mask.dz]
        key = (call.kernel, mask.lo, mask.hi)
        if key not in fused:
            fused[key] = masked_backward_kernel(library, call.kernel, mask.lo, mask.hi)
        x, dx = call.args[0], call.args[5]
        args = call.args[:DY] + [dz, z] + call.args[DY + 1:]
        take_dying_buffer(calls, i, x, dx)  # x dies here: dx takes its buffer, as before
        return at, Call(fused[key], args, [6, 7, 8], attrs=dict(call.attrs),
                        scratch=call.scratch)

    return merge_feeders(calls, merge)


def _masked_backward(calls: list[Call], i: int, library):
    """(index of the mask call, its GradientMask) when call i is a BatchNorm backward
    micro-kernel whose dy only a gradient mask call writes and only it reads, else None."""
    call = calls[i]
    if call.builtin or len(call.args) != 8 or not _is_bn_backward(library, call.kernel):
        return None
    dy = call.args[DY]
    readers = users(calls, dy)
    if dy.view_of is not None or len(readers) != 2 or readers[1] != i:
        return None
    at = readers[0]
    call = calls[at]
    mask = None if call.builtin else gradient_mask(library, call.kernel)
    if mask is None or call.outputs != [mask.out] or call.args[mask.out] is not dy or \
            not is_zero(call.args[mask.zero]):
        return None
    z, dz = call.args[mask.z], call.args[mask.dz]
    if z.shape != dy.shape or dz.shape != dy.shape:
        return None
    if any(s.root in (z.root, dz.root) for c in calls[at + 1:i] for s in c.writes):
        return None  # z or dz overwritten before the backward would read them
    return at, mask


def _is_bn_backward(library, kernel: str) -> bool:
    func = library.prim_func(kernel)
    planned = microkernels.plan(func, library.isa) if func is not None else None
    return planned is not None and planned[0] == "batch_norm" and \
        planned[2]["mode"] == "backward"


def masked_backward_kernel(library, kernel: str, lo: float, hi: float | None) -> str:
    """The masked variant of BatchNorm backward micro-kernel `kernel` (added to `library`)."""
    func = library.prim_func(kernel)
    family, _, params = microkernels.plan(func, library.isa)
    op = "batch_norm_relu_backward" if hi is None else "batch_norm_clip_backward"
    name = library.microkernel_name(op, family=family)
    mask = (c_float(lo, "float32"), None if hi is None else c_float(hi, "float32"))
    library.add_rendered(microkernels.render_kernel(
        func, library.isa, family, name, {**params, "mask": mask}, extra_inputs=(DY,)))
    return name
