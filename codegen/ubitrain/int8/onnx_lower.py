"""An ONNX model → the int8 layer program (layers.py): the ONNX twin of lower.py.

The same NITI layers from ONNX op types: Conv without bias, Relu, MaxPool whose windows
tile the input, Flatten or Reshape to [batch, features], and the linear layer as Gemm or
MatMul without a bias; elementwise ops with a float fallback (Gelu, Sigmoid, Tanh) go by
their ATen names, so `ub.NITI(float_fallback=("aten.gelu",))` allows them here too. Static
shape arithmetic feeding a Reshape (Shape, Gather, Concat, Unsqueeze, ...) is evaluated at
compile time by the float importer's converters, as there.

The weights keep their initializer names. A linear layer trains its weight as [out, in]:
a MatMul initializer ([in, out], what PyTorch's exporter writes for Linear(bias=False)) is
transposed once here, so `parameters()` gives it as [out, in] under its ONNX name.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import CompileError, UnsupportedOpError
from ..frontend.onnx_import import ONNX_CONVERTERS, _attrs
from ..niti import tables as fallback
from .layers import Conv, Elementwise, Flatten, LayerProgram, MaxPool, ReLU
from .lower import add_weight, finish

# ONNX op type -> the ATen name of its float fallback (fallback.FUNCTIONS).
FALLBACK_NAMES = {"Gelu": "aten.gelu", "Sigmoid": "aten.sigmoid", "Tanh": "aten.tanh"}
LAYER_OPS = ("Conv", "Relu", "MaxPool", "Flatten", "Reshape", "Gemm", "MatMul")


def _conv_out(size, kernel, stride, pad_lo, pad_hi):
    return (size + pad_lo + pad_hi - kernel) // stride + 1


def _conv(where, x_shape, w, strides=None, pads=None, dilations=None, group=1,
          auto_pad="NOTSET", **_):
    kh, kw = int(w.shape[2]), int(w.shape[3])
    strides, pads = list(strides or [1, 1]), list(pads or [0, 0, 0, 0])
    if auto_pad not in ("NOTSET", b"NOTSET") or list(dilations or [1, 1]) != [1, 1] \
            or group != 1 or pads[0] != pads[2] or pads[1] != pads[3]:
        raise UnsupportedOpError(f"{where}: Conv with auto_pad={auto_pad}, dilations="
                                 f"{dilations}, group={group}, pads={pads}: precision='int8' "
                                 "supports 2-D convs with dilation 1, group 1 and the same "
                                 "padding on both sides")
    b, _, h, width = x_shape
    out = (b, int(w.shape[0]), _conv_out(h, kh, strides[0], pads[0], pads[2]),
           _conv_out(width, kw, strides[1], pads[1], pads[3]))
    return Conv(weight="", in_shape=tuple(x_shape), out_shape=out, kernel=(kh, kw),
                stride=tuple(strides), padding=(pads[0], pads[1]), where=where)


def _linear(where, x_shape, w_out_in):
    if len(x_shape) != 2:
        raise UnsupportedOpError(f"{where}: a linear layer on a {len(x_shape)}-D input; "
                                 "precision='int8' takes [batch, features]")
    out, features = w_out_in.shape
    if features != x_shape[1]:
        raise CompileError(f"{where}: weight {list(w_out_in.shape)} does not take "
                           f"{x_shape[1]} features")
    return Conv(weight="", in_shape=(x_shape[0], features, 1, 1),
                out_shape=(x_shape[0], out, 1, 1), kernel=(1, 1), linear=True, where=where)


def _max_pool(where, x_shape, kernel_shape=None, strides=None, pads=None, dilations=None,
              ceil_mode=0, **_):
    k = tuple(kernel_shape)
    if tuple(strides or k) != k or any(pads or []) or any(d != 1 for d in dilations or []) \
            or ceil_mode:
        raise UnsupportedOpError(f"{where}: MaxPool with strides={strides}, pads={pads}, "
                                 f"ceil_mode={ceil_mode}: precision='int8' pools windows that "
                                 "tile the input (strides = kernel_shape, no padding)")
    b, c, h, w = x_shape
    return MaxPool(tuple(x_shape), (b, c, h // k[0], w // k[1]), k, where=where)


def _flatten(where, x_shape, target):
    target = [x_shape[i] if s == 0 else s for i, s in enumerate(target)]
    if -1 in target:
        known = math.prod(s for s in target if s != -1)
        target[target.index(-1)] = math.prod(x_shape) // known
    if target != [x_shape[0], math.prod(x_shape[1:])]:
        raise UnsupportedOpError(f"{where}: reshape to {target}: precision='int8' reshapes "
                                 "only by flattening to [batch, features]")
    return Flatten(tuple(x_shape), tuple(target), where=where)


def lower_onnx(model, example_input, float_fallback: tuple[str, ...] = ()) -> LayerProgram:
    """The layer chain of ONNX ModelProto `model`, whose one input takes `example_input`."""
    from onnx import numpy_helper

    graph = model.graph
    static = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in static]
    if len(inputs) != 1:
        raise CompileError(f"precision='int8' trains a model with one input tensor; this one "
                           f"has {len(inputs)}")
    _check_ops(graph, float_fallback)
    program = LayerProgram(input_name=inputs[0], input_shape=tuple(example_input.shape))
    current, shape = inputs[0], tuple(int(d) for d in example_input.shape)
    for index, node in enumerate(graph.node):
        where = node.name or f"node {index} ({node.op_type})"
        attrs = _attrs(node)
        args = [static.get(name) if name else None for name in node.input]
        if node.op_type == "Shape" and node.input[0] == current:
            static[node.output[0]] = np.array(shape, np.int64)
            continue
        if not node.input or node.input[0] != current:
            if all(a is not None for a in args):  # constants and shape arithmetic
                value = ONNX_CONVERTERS[node.op_type](None, *args, **attrs)
                static[node.output[0]] = value[0] if isinstance(value, list) else value
                continue
            raise UnsupportedOpError(f"{where}: {node.op_type} does not take the previous "
                                     "layer's output; precision='int8' trains a chain of "
                                     "layers (no branches or residual adds)")
        layer, weight = _layer(node, where, shape, args, attrs)
        if weight is not None:
            add_weight(program, layer, node.input[1], np.ascontiguousarray(weight, np.float32))
        program.layers.append(layer)
        current, shape = node.output[0], _output_shape(layer)
    if [o.name for o in graph.output] != [current]:
        raise CompileError("precision='int8' needs a model whose one output is its last layer")
    return finish(program)


def _check_ops(graph, float_fallback):
    allowed = {op for op, aten in FALLBACK_NAMES.items() if aten in float_fallback}
    known = set(LAYER_OPS) | allowed | set(ONNX_CONVERTERS)
    problems = [f"{n.name or n.op_type}: {n.op_type}" for n in graph.node
                if n.op_type not in known or n.op_type in FALLBACK_NAMES and n.op_type
                not in allowed]
    if problems:
        raise UnsupportedOpError(
            f"precision='int8': no integer (NITI) form for {'; '.join(problems)}. Supported "
            f"in int8: {', '.join(LAYER_OPS)} (Conv, Gemm and MatMul without bias), and "
            f"{', '.join(FALLBACK_NAMES)} as a float fallback when allowed: "
            "ub.NITI(float_fallback=(\"aten.gelu\",)).")


def _output_shape(layer) -> tuple[int, ...]:
    if isinstance(layer, Conv) and layer.linear:
        return tuple(layer.out_shape[:2])
    return tuple(getattr(layer, "out_shape", None) or layer.shape)


def _layer(node, where, shape, args, attrs):
    """(the layer of `node`, its float weight as the layer trains it, or None)."""
    op = node.op_type
    weight = args[1] if len(args) > 1 else None
    if op in ("Conv", "Gemm", "MatMul") and (weight is None or len(node.input) > 2):
        raise UnsupportedOpError(f"{where}: {op} needs a constant weight and no bias in "
                                 "precision='int8' (int8 layers carry no bias); export the "
                                 "layer with bias=False")
    if op == "Conv":
        return _conv(where, shape, weight, **attrs), weight
    if op == "Gemm":
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("transA", 0):
            raise UnsupportedOpError(f"{where}: Gemm with alpha != 1 or transA")
        weight = weight if attrs.get("transB", 0) else weight.T  # as [out, in]
        return _linear(where, shape, weight), weight
    if op == "MatMul":
        return _linear(where, shape, weight.T), weight.T
    if op == "Relu":
        return ReLU(shape, where=where), None
    if op == "MaxPool":
        return _max_pool(where, shape, **attrs), None
    if op == "Flatten":
        axis = attrs.get("axis", 1) % len(shape)
        return _flatten(where, shape, [math.prod(shape[:axis]), math.prod(shape[axis:])]), None
    if op == "Reshape":
        return _flatten(where, shape, [int(s) for s in weight]), None
    aten = FALLBACK_NAMES.get(op)
    if aten is None:
        raise UnsupportedOpError(f"{where}: {op} on the activations has no integer (NITI) form")
    kwargs = {"approximate": attrs.get("approximate", "none")} if op == "Gelu" else {}
    f, f_exp, d, d_exp = fallback.tables(aten, **kwargs)
    return Elementwise(aten, shape, f, f_exp, d, d_exp, where=where), None
