"""The max-pool gradient fused with the ReLU gradient after it, in place over the ReLU's output.

In a conv -> ReLU -> max-pool block the backward runs `dx = max_pool2d_backward(dy, x)` and
then `dz = where(0 < x, dx, 0)`, x being the ReLU's output: at that moment x, dx and dz's
buffer are alive (dz may take dx's or x's buffer in place, but x and dx are both needed).
Where the pooling windows tile the plane (stride = window, no padding, no dilation), one
kernel computes dz window by window, reading the window's x before writing its dz, so dz can
take x's buffer: the block's gradient needs one image-sized buffer instead of two (LeNet-5
at batch 8: 150,528 bytes less at the step's peak). The result is the same as the two calls',
bit for bit: the same winner per window and the same select (tests/test_pool_relu.py).

The ReLU gradient is recognised from its TIR (program/activation_grads.py): one store per
element of `select(0 < x[i], dx[i], c[0])` with c a constant 0; its arguments' roles come
from that TIR, not from their positions.
"""

from __future__ import annotations

from ..kernels.c_printer import CKernel
from ..kernels.microkernels import plan
from ..kernels.microkernels.render import render_template
from .activation_grads import gradient_mask, is_zero
from .inplace import take_dying_buffer
from .ir import Call, users


def fuse_pool_relu_grads(calls: list[Call], library) -> list[Call]:
    """`calls` with each (max-pool gradient, ReLU gradient) pair as one in-place call."""
    out: list[Call] = []
    for i, call in enumerate(calls):
        fused = _fuse(out[-1], call, calls, i, library) if out else None
        if fused is None:
            out.append(call)
        else:
            out[-1] = fused
    return out


def _fuse(pool: Call, relu: Call, calls: list[Call], at: int, library) -> Call | None:
    if pool.builtin or relu.builtin:
        return None
    func = library.prim_func(pool.kernel)
    planned = plan(func, library.isa) if func is not None else None
    if planned is None or planned[0] != "max_pool2d_backward":
        return None
    p = planned[2]
    window = (p["PT"], p["PL"], p["DH"], p["DW"], p["SH"], p["SW"])
    if window != (0, 0, 1, 1, p["KH"], p["KW"]):
        return None  # overlapping, padded or dilated windows
    dy, x, dx = pool.args  # the family's signature (templates/common/max_pool2d_backward.c.j2)
    mask = gradient_mask(library, relu.kernel)
    if mask is None or (mask.lo, mask.hi) != (0.0, None) or pool.outputs != [2] or \
            relu.outputs != [mask.out]:
        return None
    dz = relu.args[mask.out]
    if relu.args[mask.z] is not x or relu.args[mask.dz] is not dx or \
            not is_zero(relu.args[mask.zero]):
        return None
    if len(users(calls, dx)) != 2:
        return None  # another kernel reads the pool's gradient
    name = library.microkernel_name("max_pool2d_backward_relu")
    elements = (p["N"] * p["C"] * p["OH"] * p["OW"], p["N"] * p["C"] * p["H"] * p["W"])
    library.add_rendered(CKernel(
        name=name, params=[("in0", "float32", elements[0]), ("in1", "float32", elements[1]),
                           ("out", "float32", elements[1])], written={2}, scratch_bytes=0,
        source=render_template("common/max_pool2d_backward.c.j2", name=name, a="in0", b="in1",
                               out="out", **{**p, "relu": True}),
        notes=["max_pool2d gradient + ReLU gradient, in place"]))
    take_dying_buffer(calls, at, x, dz)  # x dies here: its gradient takes its buffer
    return Call(name, [dy, x, dz], [2], attrs=dict(relu.attrs))
