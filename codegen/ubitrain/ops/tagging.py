"""Relax legalizations that remember which op a PrimFunc came from.

LegalizeOps turns every Relax op into a TIR PrimFunc and forgets the op. The kernel library
needs it back to pick a micro-kernel, so the ops that have micro-kernels are legalized by
their default rule and the PrimFunc then carries one attribute, `ub_op`: a JSON object with
the op name, its attributes and the operand shapes. Kernels without a micro-kernel for the
target still print from the very same PrimFunc (the attribute changes nothing else).
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

ATTR = "ub_op"
CONV_ATTRS = ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout",
              "out_layout")
# The ops whose PrimFuncs are tagged, with the attributes recorded.
TAGGED_OPS = {"relax.nn.conv2d": CONV_ATTRS,
              "relax.nn.conv2d_transpose": CONV_ATTRS + ("output_padding",),
              "relax.matmul": (),
              # no micro-kernel: the depthwise weight gradient reads its input's
              # transpose where it lies (program/depthwise_input.py)
              "relax.permute_dims": ("axes",),
              # no micro-kernel: fusion keeps the sums of a gradient apart
              # (lowering/gradient_sums.py)
              "relax.add": ()}


def _plain(value):
    """A Relax attribute value (an array of IntImm, an int, a string) as a JSON value."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "value"):
        return _plain(value.value)
    try:
        return [_plain(v) for v in value]
    except TypeError:
        return str(value)


def _attrs(call, names) -> dict:
    return {k: _plain(getattr(call.attrs, k)) for k in names}


def _shape(expr):
    ty = expr.ty
    return [int(d) for d in ty.shape] if getattr(ty, "shape", None) is not None else None


def _tagging(op_name: str, attr_names):
    default = tvm.ir.Op.get(op_name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call):
        out = default(bb, call)
        tag(bb, out, op_name, _attrs(call, attr_names), call.args)
        return out

    return legalize


def tag(bb: relax.BlockBuilder, out, op_name: str, attrs: dict, args) -> None:
    """Give the PrimFunc that `out` (a call_tir) calls the `ub_op` record of `op_name`."""
    if not (isinstance(out, relax.Call) and out.op.same_as(tvm.ir.Op.get("relax.call_tir"))):
        return
    gvar = out.args[0]
    info = {"op": op_name, "attrs": attrs, "shapes": [_shape(a) for a in args],
            "dtypes": [str(a.ty.dtype) for a in args]}
    bb.update_func(gvar, bb.get()[gvar].with_attr(ATTR, json.dumps(info, sort_keys=True)))


def tagging_legalizations() -> dict:
    return {name: _tagging(name, attrs) for name, attrs in TAGGED_OPS.items()}


def op_info(func) -> dict | None:
    """The `ub_op` record of a legalized PrimFunc, or None."""
    attrs = func.attrs
    if attrs is None or ATTR not in attrs:
        return None
    return json.loads(str(attrs[ATTR]))
