"""A torch.nn.Module → the int8 layer program (layers.py), through torch.export.

A table maps each ATen op to its NITI layer. Ops NITI has no integer form for (LayerNorm,
GELU, BatchNorm, biases, ...) are all named, with where they are in the module, before
anything is lowered. The model must be a chain: each op consumes the previous op's output.
"""

from __future__ import annotations

import math

import torch

from ..errors import CompileError, UnsupportedOpError
from ..frontend.torch_export import export_module, module_path, op_label
from ..niti import tables as fallback
from ..niti.quantize import quantize_weight
from .layers import Conv, Elementwise, Flatten, LayerProgram, MaxPool, ReLU

INT32_SAFE = (2**31 - 1) // (127 * 127)  # products an int32 accumulator holds without overflow


def _pair(v, default):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return (v, v)
    return (tuple(v) * 2)[:2] if len(v) == 1 else tuple(v)


def _shape(node) -> tuple[int, ...]:
    return tuple(int(d) for d in node.meta["val"].shape)


def _conv(node, where, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if bias is not None:
        raise UnsupportedOpError(f"{where}: aten.conv2d with a bias has no integer form in "
                                 "NITI (int8 layers carry no bias); build the layer with "
                                 "bias=False")
    if isinstance(padding, str):
        raise UnsupportedOpError(f"{where}: aten.conv2d with padding={padding!r}: use integer "
                                 "padding for precision='int8'")
    if _pair(dilation, 1) != (1, 1) or groups != 1:
        raise UnsupportedOpError(f"{where}: aten.conv2d with dilation={dilation}, "
                                 f"groups={groups}: precision='int8' supports dilation 1 and "
                                 "groups 1")
    w = weight.meta["val"].shape
    return Conv(weight=weight.name, in_shape=_shape(x), out_shape=_shape(node),
                kernel=(int(w[2]), int(w[3])), stride=_pair(stride, 1),
                padding=_pair(padding, 0), where=where)


def _linear(node, where, x, weight, bias=None):
    if bias is not None:
        raise UnsupportedOpError(f"{where}: aten.linear with a bias has no integer form in "
                                 "NITI (int8 layers carry no bias); build it with bias=False")
    xs, ys = _shape(x), _shape(node)
    if len(xs) != 2:
        raise UnsupportedOpError(f"{where}: aten.linear on a {len(xs)}-D input; "
                                 "precision='int8' takes [batch, features]")
    return Conv(weight=weight.name, in_shape=(xs[0], xs[1], 1, 1),
                out_shape=(ys[0], ys[1], 1, 1), kernel=(1, 1), linear=True, where=where)


def _relu(node, where, x):
    return ReLU(_shape(node), where=where)


def _max_pool(node, where, x, kernel_size, stride=None, padding=0, dilation=1,
              ceil_mode=False):
    k = _pair(kernel_size, None)
    if _pair(stride, k) != k or _pair(padding, 0) != (0, 0) or _pair(dilation, 1) != (1, 1) \
            or ceil_mode:
        raise UnsupportedOpError(f"{where}: aten.max_pool2d with stride={stride}, "
                                 f"padding={padding}, dilation={dilation}, "
                                 f"ceil_mode={ceil_mode}: precision='int8' pools windows that "
                                 "tile the input (stride = kernel_size, no padding)")
    return MaxPool(_shape(x), _shape(node), k, where=where)


def _flatten(node, where, x, *args):
    xs, ys = _shape(x), _shape(node)
    if len(ys) != 2 or ys[0] != xs[0] or ys[1] != math.prod(xs[1:]):
        raise UnsupportedOpError(f"{where}: {op_label(node.target)} to {list(ys)}: "
                                 "precision='int8' reshapes only by flattening to "
                                 "[batch, features]")
    return Flatten(xs, ys, where=where)


aten = torch.ops.aten
INT8_LAYERS = {
    aten.conv2d.default: _conv,
    aten.linear.default: _linear,
    aten.relu.default: _relu,
    aten.relu_.default: _relu,
    aten.max_pool2d.default: _max_pool,
    aten.flatten.using_ints: _flatten,
    aten.view.default: _flatten,
    aten.reshape.default: _flatten,
    aten._unsafe_view.default: _flatten,
}


def supported_int8_ops() -> list[str]:
    return sorted({op_label(op) for op in INT8_LAYERS})


def _elementwise(node, where, x, **kwargs):
    op = op_label(node.target)
    f, f_exp, d, d_exp = fallback.tables(op, **kwargs)
    return Elementwise(op, _shape(node), f, f_exp, d, d_exp, where=where)


def lower_module(model: torch.nn.Module, example_input: torch.Tensor,
                 float_fallback: tuple[str, ...] = ()) -> LayerProgram:
    exported = export_module(model, (example_input,), training=True)
    graph = exported.graph
    allowed = set(float_fallback)
    problems = [f"{module_path(n)}: {op_label(n.target)}" for n in graph.nodes
                if n.op == "call_function" and n.target not in INT8_LAYERS
                and op_label(n.target) not in allowed]
    if problems:
        ops = "; ".join(dict.fromkeys(problems))
        raise UnsupportedOpError(
            f"precision='int8': no integer (NITI) form for {ops}. Supported in int8: "
            f"{', '.join(supported_int8_ops())} (conv2d and linear without bias). Train this "
            "model with precision='fp32', replace these layers, or allow a float fallback for "
            "an elementwise op: ub.NITI(float_fallback=(\"aten.gelu\",)) (available for "
            f"{', '.join(fallback.FUNCTIONS)}).")

    targets = {s.arg.name: s.target for s in exported.graph_signature.input_specs
               if s.kind.name in ("PARAMETER", "BUFFER")}
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    inputs = [n for n in placeholders if n.name not in targets]
    if len(inputs) != 1:
        raise CompileError(f"precision='int8' trains a model with one input tensor; this one "
                           f"has {len(inputs)}")
    program = LayerProgram(input_name=inputs[0].name, input_shape=tuple(example_input.shape))
    current = inputs[0]
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        where = module_path(node)
        x = node.args[0]
        if x is not current:
            raise UnsupportedOpError(f"{where}: {op_label(node.target)} does not take the "
                                     "previous layer's output; precision='int8' trains a "
                                     "chain of layers (no branches or residual adds)")
        convert = INT8_LAYERS.get(node.target, _elementwise)
        layer = convert(node, where, *node.args, **node.kwargs)
        if isinstance(layer, Conv):
            name = targets.get(layer.weight)
            if name is None:
                raise CompileError(f"{where}: the weight of {op_label(node.target)} is not a "
                                   "parameter of the module")
            add_weight(program, layer, name, state[name].detach().cpu().numpy())
        program.layers.append(layer)
        current = node
    outputs = [n for n in graph.nodes if n.op == "output"][0].args[0]
    if len(outputs) != 1 or outputs[0] is not current:
        raise CompileError("precision='int8' needs a model whose one output is its last layer")
    return finish(program)


def add_weight(program: LayerProgram, layer: Conv, name: str, value):
    """Give `layer` its weight `name`, quantized from the float array `value`."""
    layer.weight = name
    if layer.reduction > INT32_SAFE:
        raise CompileError(f"{layer.where}: {layer.reduction} int8 products per int32 "
                           f"accumulator could overflow (at most {INT32_SAFE}); use a "
                           "smaller batch or layer for precision='int8'")
    program.weights[name] = quantize_weight(name, value)


def finish(program: LayerProgram) -> LayerProgram:
    """Check that the chain trains something into logits, and number its rescale sites."""
    if not program.layers:
        raise CompileError("precision='int8' needs a model whose one output is its last layer")
    if not any(isinstance(layer, Conv) for layer in program.layers):
        raise CompileError("precision='int8': the model has no conv2d or linear layer to train")
    if len(program.output_shape) != 2:
        raise CompileError("precision='int8' needs logits [batch, classes] as the output")
    program.number_sites()
    return program
