"""Each node of an ONNX graph as the ATen op it computes, so that a check written over a
PyTorch module's ops (precision="int8": training/niti_ops.py) reads an ONNX model too.

A node becomes (where, op type, ATen op, ATen-style arguments): TENSOR for a tensor computed at
run time or a parameter, the number for a scalar constant, the array for another constant.
Nodes over compile-time values only (shape arithmetic, which the importer evaluates), a
parameter's layout (a Transpose of a weight) and the no-ops (Identity, Shape, Cast to float,
Dropout at inference) compute nothing at run time and are left out. An op type not mapped
here maps to None, which a check refuses (tests/test_int8_onnx.py keeps every op the
importer converts mapped).
"""

from __future__ import annotations

import numpy as np

from .aten.registry import aten
from .onnx_import import (
    ONNX_CONVERTERS,
    _attrs,
    check_opsets,
    check_supported_onnx,
    load_onnx,
    node_label,
)


class _Tensor:
    """Printed "x" in a refusal: aten.add.Tensor(x, 1.0)."""

    def __repr__(self):
        return "x"


TENSOR = _Tensor()  # a run-time tensor or a parameter, among an op's arguments
COMPUTED = "<computed>"  # a constant whose value only the importer computes
NO_OP = "no op"  # a node that computes nothing at run time
_PARAMETER = "parameter"  # a float initializer, or a layout of one (an operand kind here)
LAYOUT = {"Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze", "Identity"}
DIRECT = {"Relu": aten.relu.default, "Sigmoid": aten.sigmoid.default,
          "Tanh": aten.tanh.default, "HardSwish": aten.hardswish.default,
          "Gelu": aten.gelu.default, "Erf": aten.erf.default, "Neg": aten.neg.default,
          "Sqrt": aten.sqrt.default, "Exp": aten.exp.default, "Log": aten.log.default,
          "Abs": aten.abs.default, "Reciprocal": aten.reciprocal.default,
          "Pow": aten.pow.Tensor_Scalar, "Add": aten.add.Tensor, "Sub": aten.sub.Tensor,
          "Mul": aten.mul.Tensor, "Div": aten.div.Tensor,
          "LayerNormalization": aten.layer_norm.default,
          "BatchNormalization": aten._native_batch_norm_legit_functional.default,
          "MaxPool": aten.max_pool2d.default, "AveragePool": aten.avg_pool2d.default,
          "GlobalAveragePool": aten.adaptive_avg_pool2d.default,
          "ReduceMean": aten.mean.dim, "ReduceSum": aten.sum.dim_IntList,
          "Flatten": aten.flatten.using_ints, "Reshape": aten.reshape.default,
          "Transpose": aten.permute.default, "Concat": aten.cat.default,
          "Unsqueeze": aten.unsqueeze.default, "Squeeze": aten.squeeze.dims,
          "Clip": aten.hardtanh.default}  # Clip: what ReLU6 and Hardtanh export as


def _conv(node, operands, ranks):
    rank = ranks.get(node.input[1]) or len(_attrs(node).get("kernel_shape", [0, 0])) + 2
    return {4: aten.conv2d.default, 3: aten.conv1d.default}.get(rank, aten.convolution.default)


def _product(node, operands, ranks):
    """x @ W (Linear's export) is aten.linear; a product of two activations, or a Gemm
    with its first operand transposed, is aten.matmul / aten.addmm."""
    by_weight = operands[1] is _PARAMETER and not _attrs(node).get("transA", 0)
    if by_weight:
        return aten.linear.default
    return aten.addmm.default if node.op_type == "Gemm" else aten.matmul.default


def _dropout(node, operands, ranks):
    """The importer's: a Dropout without training_mode (or with it false) is the identity."""
    training = operands[2] if len(operands) > 2 else None
    return NO_OP if training is None or _number(training) is False else \
        aten.native_dropout.default


def _cast(node, operands, ranks):
    return NO_OP if _attrs(node).get("to", 1) == 1 else aten._to_copy.default


SPECIAL = {"Conv": _conv, "Gemm": _product, "MatMul": _product, "Dropout": _dropout,
           "Cast": _cast, "Identity": lambda *_: NO_OP}
# the importer evaluates these at compile time (and refuses a Gather of a run-time tensor)
COMPILE_TIME = {"Constant", "Shape", "Gather"}
MAPPED = set(DIRECT) | set(SPECIAL) | COMPILE_TIME


def _aten_op(node, operands, ranks):
    """The ATen op `node` computes: NO_OP for none, None for an op type mapped to none."""
    if node.op_type in DIRECT:
        return DIRECT[node.op_type]
    rule = SPECIAL.get(node.op_type)
    return rule(node, operands, ranks) if rule else None


def _number(value):
    """A scalar constant as a Python number (else the value as it is)."""
    if isinstance(value, np.ndarray) and value.size == 1:
        return value.reshape(()).item()
    return value


def aten_uses(model) -> list[tuple[str, str, object, tuple]]:
    """The run-time ops of ONNX `model` (path or ModelProto) as ATen ones, in graph order:
    (where, op type, ATen op or None for no mapping, arguments). Refuses first what the
    importer refuses (frontend/onnx_import.py), with its message."""
    import onnx

    model = load_onnx(model)
    graph = model.graph
    check_supported_onnx(graph, check_opsets(model))
    kinds: dict = {}  # value name -> TENSOR, _PARAMETER, an array or COMPUTED
    ranks: dict = {}
    for t in graph.initializer:
        value = onnx.numpy_helper.to_array(t)
        kinds[t.name] = _PARAMETER if value.dtype.kind == "f" else value
        ranks[t.name] = value.ndim
    for i in graph.input:
        kinds.setdefault(i.name, TENSOR)
    uses = []
    for node in graph.node:
        operands = [kinds.get(i, TENSOR) if i else None for i in node.input]
        present = [o for o in operands if o is not None]
        if node.op_type == "Constant":
            out = ONNX_CONVERTERS["Constant"](None, **_attrs(node))
        elif node.op_type in COMPILE_TIME or all(o is not TENSOR and o is not _PARAMETER
                                                 for o in present):
            out = COMPUTED  # shape arithmetic
        elif node.op_type in LAYOUT and present and present[0] is _PARAMETER:
            out = _PARAMETER  # a weight's layout
        else:
            out = TENSOR
            op = _aten_op(node, operands, ranks)
            if op is not NO_OP:
                args = tuple(TENSOR if o is _PARAMETER else _number(o) for o in operands)
                if node.op_type == "Clip":
                    args = _clip_bounds(node, args)
                uses.append((f"node {node_label(node)!r}", node.op_type, op, args))
        for name in node.output:
            kinds[name] = out
    return uses


def _clip_bounds(node, args):
    """Clip's (x, min, max): inputs from Clip-11 on, attributes before; a bound left out
    is none (infinite)."""
    attrs = _attrs(node)
    lo = args[1] if len(args) > 1 and args[1] is not None else attrs.get("min", -np.inf)
    hi = args[2] if len(args) > 2 and args[2] is not None else attrs.get("max", np.inf)
    return (args[0], lo, hi)
