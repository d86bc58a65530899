"""The depthwise conv's weight gradient reads its input where it lies, not a transposed copy.

Relax writes the weight gradient of a depthwise conv as a grouped conv over x transposed to
channel-major ([C, N, H, W], then viewed as [C * N, 1, H, W]), so the backward first copies
all of x into that order (a kernel that reads and writes the tensor once each), and the
weight gradient then reads the copy. Where that gradient is a micro-kernel
(templates/common/depthwise*.c.j2) and the copy has no other reader, the micro-kernel
reads the plane of x at (n, c) itself: the copy and its buffer are gone. Every plane is the
same numbers, read in the same order, so the step is bit-identical
(tests/test_depthwise_input.py).
"""

from __future__ import annotations

from ..kernels import microkernels
from ..kernels.microkernels.manifest import GEMM_CORES
from ..ops.tagging import op_info
from .ir import Call, Slot, merge_feeders, users


def read_depthwise_inputs_in_place(calls: list[Call], library) -> list[Call]:
    """`calls` with each (transpose of x, depthwise weight gradient) pair as one call."""
    variants: dict[str, str] = {}  # weight-gradient kernel -> its variant reading x as stored

    def merge(i):
        at = _transpose_feeding(calls, i, library)
        if at is None:
            return None
        call = calls[i]
        if call.kernel not in variants:
            variants[call.kernel] = depthwise_input_kernel(library, call.kernel)
        kernel = library.kernels[variants[call.kernel]]
        scratch = Slot(call.scratch.name, (kernel.scratch_bytes,), "uint8", "scratch")
        return at, Call(kernel.name, [calls[at].args[0]] + call.args[1:], list(call.outputs),
                        attrs=dict(call.attrs), scratch=scratch)

    return merge_feeders(calls, merge)


def _planned_weight_gradient(library, kernel: str):
    func = library.prim_func(kernel)
    planned = microkernels.plan(func, library.isa) if func is not None else None
    if planned is None or planned[0] not in ("depthwise", "depthwise_strided") \
            or planned[2]["mode"] != "bwd_weight":
        return None
    return func, planned


def _transpose_feeding(calls: list[Call], i: int, library) -> int | None:
    """The index of the call that transposes x for call i, a depthwise weight gradient
    micro-kernel, when only that call reads the transposed copy; else None. The transpose is
    training/gradients.py's: x viewed as [N, groups, 1, H, W], its first two axes swapped."""
    call = calls[i]
    planned = None if call.builtin else _planned_weight_gradient(library, call.kernel)
    if planned is None:
        return None
    p = planned[1][2]
    copy = call.args[0].root
    readers = users(calls, copy)
    if len(readers) != 2 or readers[1] != i:
        return None
    at = readers[0]
    transpose = calls[at]
    func = None if transpose.builtin else library.prim_func(transpose.kernel)
    info = op_info(func) if func is not None else None
    if (info is None or info["op"] != "relax.permute_dims"
            or info["attrs"]["axes"] != [1, 0, 2, 3, 4]
            or info["shapes"][0] != [p["N"], p["C"], 1, p["H"], p["W"]]
            or transpose.writes != [copy]):
        return None
    return at


def depthwise_input_kernel(library, kernel: str) -> str:
    """The variant of depthwise weight-gradient micro-kernel `kernel` that reads x as stored
    (added to `library`). Where its taps' sums fit the registers (the direct loop of
    templates/common/depthwise.c.j2) and there are several images, it reads the planes of x
    and dy in memory order too, each channel's sums kept in scratch between its planes, [C][K]
    vectors and [C][K] floats (of one image, the channel order is the memory order)."""
    func, (family, op, params) = _planned_weight_gradient(library, kernel)
    params = {**params, "x_nchw": True}
    core = GEMM_CORES[library.isa]
    if family == "depthwise" and params["K"] + 2 <= 2 * core.run_sums and params["N"] > 1:
        params["sums_offset"] = params["scratch_bytes"]
        params["scratch_bytes"] += 4 * params["C"] * params["K"] * (core.vec + 1)
    name = library.microkernel_name(op)
    library.add_rendered(microkernels.render_kernel(func, library.isa, family, name, params))
    return name
