"""ONNX → Relax for training: a table `{op_type: converter}` over the graph's nodes.

TVM's ONNX importer builds an inference graph: Clip becomes already-legalized kernels,
LayerNorm and GELU become ops with no gradient rule, BatchNormalization and Dropout take
their inference semantics. For training, ubitrain converts the nodes itself into the same
differentiable Relax constructs as the PyTorch frontend (the converters of frontend/aten/).

Export from PyTorch with `torch.onnx.export(model, args, path, dynamo=False,
training=torch.onnx.TrainingMode.TRAINING)`: an eval-mode export folds BatchNorm into the
convolution weights, and then there is no BatchNorm left to train. Initializers become the
model's state under their ONNX names (the state_dict names, for a PyTorch export); those
that feed BatchNorm's statistics are buffers, the other float ones parameters. BatchNorm's
running variance follows PyTorch (unbiased batch variance), as the model came from there.
Shape arithmetic (Shape, Gather, Concat, ... on static shapes) is evaluated at compile time.

The onnx package is an optional extra (`pip install 'ubitrain[onnx]'`): it is imported only
when a model is an ONNX one (require_onnx), never by `import ubitrain`.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ..errors import CompileError, UnsupportedOpError
from .aten import (
    ConvertContext,
    activations,
    arithmetic,
    dropout,
    layout,
    math_functions,
    normalization,
    pooling,
    shape_of,
)
from .aten.registry import aten, dtype_of
from .dtypes import check_onnx_dtypes
from .forward import StateTensor, TensorSpec, c_ident, c_name, emit_forward

ONNX_CONVERTERS: dict = {}


def onnx_op(*op_types):
    def register(fn):
        for t in op_types:
            ONNX_CONVERTERS[t] = fn
        return fn
    return register


def require_onnx():
    """The onnx package, imported on first use: ONNX models are an optional extra."""
    try:
        import onnx
    except ImportError:
        raise CompileError("ONNX models need the onnx extra: pip install 'ubitrain[onnx]'") \
            from None
    return onnx


def load_onnx(model):
    onnx = require_onnx()
    if isinstance(model, (str, Path)):
        try:
            model = onnx.load(str(model))
        except Exception as err:
            raise CompileError(f"cannot read the ONNX model {str(model)!r}: {err}") from None
    return model


def _attrs(node) -> dict:
    import onnx

    values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def _static(values) -> bool:
    return all(v is None or isinstance(v, np.ndarray) for v in values)


# ---- arithmetic and activations ---------------------------------------------------------------
def _binary(fn, np_fn):
    def convert(ctx, a, b):
        if _static([a, b]):
            return np_fn(a, b)
        if isinstance(a, np.ndarray):
            a = relax.const(a.astype(dtype_of(b)))
        if isinstance(b, np.ndarray):
            b = relax.const(b.astype(dtype_of(a)))
        return ctx.emit(fn(a, b))
    return convert


onnx_op("Add")(_binary(R.add, np.add))
onnx_op("Sub")(_binary(R.subtract, np.subtract))
onnx_op("Mul")(_binary(R.multiply, np.multiply))
onnx_op("Div")(_binary(R.divide, lambda a, b: a // b if a.dtype.kind in "iu" else a / b))


@onnx_op("Relu")
def _relu(ctx, x):
    return activations.relu(ctx, None, x)


def _aten(ctx, op, ours):
    """The converter of ATen `op`: the caller's (ctx.converters: the int8 pipeline's tables,
    ops/table_activation.py) or `ours`."""
    return ctx.converters.get(op, ours)


@onnx_op("Sigmoid")
def _sigmoid(ctx, x):
    return _aten(ctx, aten.sigmoid.default, activations.sigmoid)(ctx, None, x)


@onnx_op("Tanh")
def _tanh(ctx, x):
    return _aten(ctx, aten.tanh.default, activations.tanh)(ctx, None, x)


@onnx_op("Erf")
def _erf(ctx, x):
    return ctx.emit(R.erf(x))


@onnx_op("HardSwish")
def _hardswish(ctx, x):
    return _aten(ctx, aten.hardswish.default, activations.hardswish)(ctx, None, x)


@onnx_op("Gelu")
def _gelu(ctx, x, approximate="none"):
    return _aten(ctx, aten.gelu.default, activations.gelu)(ctx, None, x, approximate)


@onnx_op("Clip")
def _clip(ctx, x, lo=None, hi=None, min=None, max=None):  # noqa: A002 - ONNX's names
    """Clip-11 on reads its bounds as inputs; Clip-1 and Clip-6, as attributes min and max."""
    lo = min if lo is None else lo
    hi = max if hi is None else hi
    lo = float(lo) if lo is not None else -np.inf
    hi = float(hi) if hi is not None else np.inf
    return ctx.emit(R.clip(x, lo, hi))


@onnx_op("Neg")
def _neg(ctx, x):
    return arithmetic.neg(ctx, None, x)


@onnx_op("Pow")
def _pow(ctx, x, y):
    if not (isinstance(y, np.ndarray) and y.size == 1):
        raise UnsupportedOpError(f"{ctx.where}: Pow with a tensor exponent is not supported; "
                                 "give the exponent as a constant")
    return math_functions.pow_scalar(ctx, None, x, float(y))


@onnx_op("Sqrt")
def _sqrt(ctx, x):
    return ctx.emit(R.sqrt(x))


@onnx_op("Exp")
def _exp(ctx, x):
    return math_functions.exp(ctx, None, x)


@onnx_op("Log")
def _log(ctx, x):
    return math_functions.log(ctx, None, x)


@onnx_op("Abs")
def _abs(ctx, x):
    return math_functions.abs_(ctx, None, x)


@onnx_op("Reciprocal")
def _reciprocal(ctx, x):
    return math_functions.reciprocal(ctx, None, x)


# ---- linear algebra and convolution -----------------------------------------------------------
@onnx_op("Gemm")
def _gemm(ctx, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
    if alpha != 1.0 or beta != 1.0:
        raise UnsupportedOpError(f"{ctx.where}: Gemm with alpha/beta other than 1")
    a = ctx.emit(R.permute_dims(a, [1, 0])) if transA else a
    b = ctx.emit(R.permute_dims(b, [1, 0])) if transB else b
    y = ctx.emit(R.matmul(a, b))
    return ctx.emit(R.add(y, c)) if c is not None else y


@onnx_op("MatMul")
def _matmul(ctx, a, b):
    return ctx.emit(R.matmul(a, b))


@onnx_op("Conv")
def _conv(ctx, x, w, b=None, strides=None, pads=None, dilations=None, group=1):
    rank = len(shape_of(x)) - 2
    if rank not in (1, 2):
        raise UnsupportedOpError(f"{ctx.where}: Conv over {rank} spatial dimensions; Conv1d "
                                 "and Conv2d are supported")
    strides, dilations = strides or [1] * rank, dilations or [1] * rank
    pads = pads or [0] * (2 * rank)
    if rank == 1:  # as a Conv2d over a height of one
        n, c, length = shape_of(x)
        o, i, k = shape_of(w)
        x = ctx.emit(R.reshape(x, (n, c, 1, length)))
        w = ctx.emit(R.reshape(w, (o, i, 1, k)))
        strides, dilations, pads = [1, *strides], [1, *dilations], [0, pads[0], 0, pads[1]]
    else:
        pads = [pads[0], pads[1], pads[2], pads[3]]
    y = ctx.emit(R.nn.conv2d(x, w, strides=strides, padding=pads, dilation=dilations,
                             groups=group))
    if b is not None:
        y = ctx.emit(R.add(y, ctx.emit(R.reshape(b, (1, shape_of(b)[0], 1, 1)))))
    if rank == 1:
        y = ctx.emit(R.reshape(y, (n, o, shape_of(y)[-1])))
    return y


# ---- normalisation ----------------------------------------------------------------------------
@onnx_op("BatchNormalization")
def _batch_norm(ctx, x, w, b, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0):
    # ONNX's momentum keeps the old statistic; PyTorch's weighs the new one.
    if ctx.training and training_mode:
        y, _, _, new_mean, new_var = normalization.batch_norm_training(
            ctx, None, x, w, b, mean, var, True, 1.0 - momentum, epsilon)
        return [y, new_mean, new_var]
    return [normalization.batch_norm_eval(ctx, None, x, w, b, mean, var, 1.0 - momentum,
                                          epsilon)[0]]


@onnx_op("LayerNormalization")
def _layer_norm(ctx, x, w=None, b=None, axis=-1, epsilon=1e-5):
    rank = len(shape_of(x))
    return normalization.layer_norm_op(ctx, None, x, shape_of(x)[axis % rank:], w, b, epsilon)


# ---- pooling and reductions -------------------------------------------------------------------
@onnx_op("MaxPool")
def _max_pool(ctx, x, kernel_shape=None, strides=None, pads=None, dilations=None,
              ceil_mode=0):
    pads = pads or [0, 0, 0, 0]
    return ctx.emit(R.nn.max_pool2d(x, kernel_shape, strides or kernel_shape,
                                    [pads[0], pads[1], pads[2], pads[3]], dilations or [1, 1],
                                    ceil_mode=bool(ceil_mode)))


@onnx_op("AveragePool")
def _avg_pool(ctx, x, kernel_shape=None, strides=None, pads=None, ceil_mode=0,
              count_include_pad=0):
    pads = pads or [0, 0, 0, 0]
    return ctx.emit(R.nn.avg_pool2d(x, kernel_shape, strides or kernel_shape,
                                    [pads[0], pads[1], pads[2], pads[3]], [1, 1],
                                    ceil_mode=bool(ceil_mode),
                                    count_include_pad=bool(count_include_pad)))


@onnx_op("GlobalAveragePool")
def _global_avg_pool(ctx, x):
    return ctx.emit(R.mean(x, axis=list(range(2, len(shape_of(x)))), keepdims=True))


def _reduce(fn):
    def convert(ctx, x, axes_input=None, axes=None, keepdims=1):
        axes = axes_input if axes_input is not None else axes
        axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
        return fn(ctx, None, x, axes, bool(keepdims))
    return convert


onnx_op("ReduceMean")(_reduce(pooling.mean))
onnx_op("ReduceSum")(_reduce(pooling.sum_))


# ---- layout and shape arithmetic --------------------------------------------------------------
@onnx_op("Flatten")
def _flatten(ctx, x, axis=1):
    shape = shape_of(x)
    axis %= len(shape)
    return layout.reshape_to(ctx, x, [int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))])


@onnx_op("Reshape")
def _reshape(ctx, x, shape):
    shape = [int(s) for s in shape]
    current = shape_of(x)
    shape = [current[i] if s == 0 else s for i, s in enumerate(shape)]  # 0 copies the dim
    return layout.reshape_to(ctx, x, shape)


@onnx_op("Transpose")
def _transpose(ctx, x, perm=None):
    perm = perm or list(reversed(range(len(shape_of(x)))))
    return ctx.emit(R.permute_dims(x, perm))


@onnx_op("Concat")
def _concat(ctx, *tensors, axis=0):
    if _static(tensors):
        return np.concatenate(tensors, axis)
    return layout.cat(ctx, None, list(tensors), axis)


@onnx_op("Unsqueeze")
def _unsqueeze(ctx, x, axes_input=None, axes=None):
    axes = sorted(int(a) for a in np.asarray(axes_input if axes_input is not None else axes)
                  .reshape(-1))
    if isinstance(x, np.ndarray):
        return np.expand_dims(x, axes)
    shape = list(shape_of(x))
    for a in axes:
        shape.insert(a % (len(shape) + 1), 1)
    return layout.reshape_to(ctx, x, shape)


@onnx_op("Squeeze")
def _squeeze(ctx, x, axes_input=None, axes=None):
    axes = axes_input if axes_input is not None else axes
    if isinstance(x, np.ndarray):
        return np.squeeze(x, tuple(int(a) for a in np.asarray(axes).reshape(-1)))
    return layout.squeeze(ctx, None, x, None if axes is None else
                      [int(a) for a in np.asarray(axes).reshape(-1)])


@onnx_op("Shape")
def _shape(ctx, x):
    return np.array(x.shape if isinstance(x, np.ndarray) else shape_of(x), np.int64)


@onnx_op("Gather")
def _gather(ctx, data, indices, axis=0):
    if not _static([data, indices]):
        raise UnsupportedOpError(f"{ctx.where}: Gather over a tensor computed at run time is "
                                 "not supported (only over static shapes)")
    return np.take(data, indices, axis)


@onnx_op("Cast")
def _cast(ctx, x, to=1):
    if isinstance(x, np.ndarray):
        import onnx

        return x.astype(onnx.helper.tensor_dtype_to_np_dtype(to))
    return x if to == 1 else ctx.emit(R.astype(x, "float32"))


@onnx_op("Constant")
def _constant(ctx, value=None, value_float=None, value_int=None, value_ints=None):
    import onnx

    if value is not None:
        return onnx.numpy_helper.to_array(value)
    return np.array(value_float if value_float is not None else
                    value_int if value_int is not None else value_ints)


@onnx_op("Identity")
def _identity(ctx, x):
    return x


@onnx_op("Dropout")
def _dropout(ctx, x, ratio=None, training_mode=None):
    p = float(ratio) if ratio is not None else 0.5
    train = bool(training_mode) if training_mode is not None else False
    out, mask = dropout.native_dropout(ctx, None, x, p, ctx.training and train)
    return [out] if mask is None else [out, mask]


# ---- versions and attributes ------------------------------------------------------------------
# The first version of each op whose semantics the converter implements (an op's semantics
# are those of its newest version at or below the model's opset). Before these: Add, Sub,
# Mul, Div, Pow and Gemm broadcast by a `broadcast` attribute; BatchNormalization has no
# training mode; Dropout-7/10 is always the identity; Reshape-1 and Cast-1 take attributes
# that later versions take as inputs or as numbers; Concat-1's axis is optional.
FIRST_VERSION = {"Add": 7, "Sub": 7, "Mul": 7, "Div": 7, "Pow": 7, "Gemm": 7,
                 "BatchNormalization": 14, "Dropout": 12, "Reshape": 5, "Cast": 6, "Concat": 4}
ANY = object()
# Attributes a converter does not read, accepted only at the value with which the converter's
# semantics hold (ANY: whatever their value; they restate what the inputs say).
PASSIVE_ATTRIBUTES = {
    "Conv": {"auto_pad": "NOTSET", "kernel_shape": ANY},
    "MaxPool": {"auto_pad": "NOTSET", "storage_order": 0},
    "AveragePool": {"auto_pad": "NOTSET", "dilations": [1, 1]},
    "ReduceMean": {"noop_with_empty_axes": 0}, "ReduceSum": {"noop_with_empty_axes": 0},
    "Reshape": {"allowzero": 0}, "Shape": {"start": 0}, "Cast": {"saturate": 1},
    "LayerNormalization": {"stash_type": 1}, "Dropout": {"seed": ANY},
}


def check_opsets(model) -> dict[str, int]:
    """{domain: opset} of the model; an opset newer than the onnx package knows, or a
    domain other than ONNX's own, is refused."""
    import onnx.defs

    newest = onnx.defs.onnx_opset_version()
    opsets = {o.domain or "": o.version for o in model.opset_import}
    if opsets.get("", 0) > newest:
        raise UnsupportedOpError(f"the model declares ONNX opset {opsets['']}, newer than "
                                 f"the newest this onnx package knows ({newest}); export "
                                 f"with opset_version <= {newest}")
    return opsets


def node_label(node) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


def check_supported_onnx(graph, opsets: dict[str, int]) -> None:
    """Every node's op, version and attributes, checked before any is converted."""
    import onnx.defs

    problems = []
    for n in graph.node:
        where = f"node {node_label(n)!r}"
        if n.domain not in ("", "ai.onnx"):
            problems.append(f"{where}: op {n.op_type} of domain {n.domain!r} is not supported "
                            "(only ONNX's own ops)")
            continue
        if n.op_type not in ONNX_CONVERTERS:
            problems.append(f"{where}: ONNX op {n.op_type} is not supported")
            continue
        opset = opsets.get("", 1)
        try:
            since = onnx.defs.get_schema(n.op_type, opset, "").since_version
        except Exception:  # noqa: BLE001 - onnx: no version of the op at this opset
            problems.append(f"{where}: {n.op_type} does not exist at opset {opset}")
            continue
        first = FIRST_VERSION.get(n.op_type, 1)
        if since < first:
            problems.append(f"{where}: {n.op_type}-{since} (opset {opset}) is not supported; "
                            f"{n.op_type} is from version {first} on: export with "
                            f"opset_version >= {first}")
        problems += [f"{where}: {p}" for p in _attribute_problems(n)]
    if problems:
        raise UnsupportedOpError("; ".join(problems) + ". The supported ops are in the README.")


def _attribute_problems(node) -> list[str]:
    converter = ONNX_CONVERTERS[node.op_type]
    takes = inspect.signature(converter).parameters
    problems = []
    for name, value in _attrs(node).items():
        if name in takes:
            continue
        allowed = PASSIVE_ATTRIBUTES.get(node.op_type, {}).get(name, None)
        if allowed is ANY or (allowed is not None and _same(value, allowed)):
            continue
        problems.append(f"{node.op_type} attribute {name}={value!r} is not supported"
                        + (f" (only {allowed!r})" if allowed is not None else ""))
    return problems


def _same(value, allowed) -> bool:
    return (list(value) if isinstance(value, (list, tuple)) else value) == allowed


# ---- the graph --------------------------------------------------------------------------------
SECOND_INPUT_ATTRS = {"ReduceMean": "axes_input", "ReduceSum": "axes_input",
                      "Unsqueeze": "axes_input", "Squeeze": "axes_input"}
BUFFER_INPUTS = {"BatchNormalization": (3, 4)}


def import_onnx(model, example_inputs: tuple, training: bool, extend=None,
                converters=None) -> tuple:
    """Convert an ONNX model (path or ModelProto) like `torch_export.import_forward`
    (`converters`: {ATen op: converter} in place of ours, for the ops that map to one)."""
    onnx = require_onnx()
    model = load_onnx(model)
    graph = model.graph
    if not graph.node:
        raise CompileError("the ONNX model has no nodes (an empty or truncated file?)")
    check_supported_onnx(graph, check_opsets(model))
    check_onnx_dtypes(graph, onnx)
    initializers = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    buffers = {n.input[i] for n in graph.node for i in BUFFER_INPUTS.get(n.op_type, ())
               if i < len(n.input)}
    ctx = ConvertContext(bb=relax.BlockBuilder(), training=training,
                         converters=converters or {})
    env: dict = {}
    inputs, input_specs, state, state_vars = [], [], [], {}
    graph_inputs = [i for i in graph.input if i.name not in initializers]
    if len(graph_inputs) != len(example_inputs):
        raise CompileError(f"the ONNX model takes {len(graph_inputs)} input(s) "
                           f"({[i.name for i in graph_inputs]}); got {len(example_inputs)}")
    for spec, example in zip(graph_inputs, example_inputs):
        shape, dtype = tuple(example.shape), str(example.dtype).replace("torch.", "")
        var = relax.Var(c_ident(spec.name), relax.TensorType(shape, dtype))
        inputs.append(var)
        input_specs.append(TensorSpec(c_ident(spec.name), shape, dtype))
        env[spec.name] = var
    for name, value in initializers.items():
        if value.dtype.kind == "f" or name in buffers:
            var = relax.Var(c_name(name), relax.TensorType(value.shape, str(value.dtype)))
            state.append(StateTensor(name, value.copy(), name not in buffers))
            state_vars[name] = env[name] = var
        else:
            env[name] = value  # integer shapes and indices: compile-time values

    def body():
        updates, statistics = {}, set()  # new running stats, by buffer and by output name
        for node in graph.node:
            ctx.where = f"node {node_label(node)!r} ({node.op_type})"
            undefined = [i for i in node.input if i and i not in env]
            if undefined:
                raise CompileError(f"{ctx.where} reads {', '.join(map(repr, undefined))}, "
                                   "which no graph input, initializer or earlier node defines")
            args = [env[i] if i else None for i in node.input]
            takes = inspect.signature(ONNX_CONVERTERS[node.op_type]).parameters
            attrs = {k: v for k, v in _attrs(node).items() if k in takes}  # others: passive
            if node.op_type in SECOND_INPUT_ATTRS and len(args) > 1:
                attrs[SECOND_INPUT_ATTRS[node.op_type]] = args.pop(1)
            try:
                result = ONNX_CONVERTERS[node.op_type](ctx, *args, **attrs)
            except CompileError:
                raise
            except Exception as err:
                raise CompileError(f"{ctx.where}: conversion failed: {err}") from err
            results = result if isinstance(result, list) else [result]
            for name, value in zip(node.output, results):
                env[name] = value
            if node.op_type == "BatchNormalization" and len(results) == 3:
                updates[node.input[3]], updates[node.input[4]] = results[1], results[2]
                statistics.update(node.output[1:3])
        outputs = [env[o.name] for o in graph.output if o.name not in statistics]
        return outputs, updates

    return emit_forward(ctx, inputs, input_specs, state, state_vars, body, extend)


def is_onnx_model(model) -> bool:
    if isinstance(model, (str, Path)):
        return str(model).endswith(".onnx")
    return type(model).__name__ == "ModelProto"
