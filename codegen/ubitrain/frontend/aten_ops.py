"""The table of supported ATen ops: `{aten overload: converter}` into Relax.

Each converter receives the conversion context, the FX node and the node's arguments with
tensors already converted to Relax expressions, and returns a Relax expression (or a tuple
of them for multi-output ops). Training-mode semantics follow PyTorch: BatchNorm uses batch
statistics and returns updated running statistics; Dropout multiplies by a mask that the C
runtime draws each step from its seeded RNG.

To add an op: write a converter here with `@converts(...)`, give it a gradient in
`training/gradients.py` if Relax has none, and add a case to `tests/test_ops.py`.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
from tvm import relax
from tvm.relax import op as R

from ..errors import UnsupportedOpError
from ..training.batch_norm import batch_norm_train
from ..training.layer_norm import layer_norm

aten = torch.ops.aten
ATEN_CONVERTERS: dict = {}


@dataclass
class ConvertContext:
    bb: relax.BlockBuilder
    training: bool
    where: str = "<top>"
    dropout_masks: list = field(default_factory=list)  # (mask var, probability)

    def emit(self, expr):
        return self.bb.emit(expr)


def converts(*targets):
    def register(fn):
        for t in targets:
            ATEN_CONVERTERS[t] = fn
        return fn
    return register


def supported_op_names() -> list[str]:
    names = set()
    for t in ATEN_CONVERTERS:
        packet = getattr(t, "_overloadpacket", None)
        name = "aten." + str(packet).split(".")[-1] if packet else getattr(t, "__name__", str(t))
        names.add(name)
    return sorted(names - {"getitem"})


# ---- helpers ---------------------------------------------------------------------------------
def shape_of(x) -> tuple[int, ...]:
    return tuple(int(d) for d in x.ty.shape)


def dtype_of(x) -> str:
    return str(x.ty.dtype)


def as_expr(value, like):
    """A Python scalar becomes a Relax constant of the other operand's dtype."""
    if isinstance(value, relax.Expr):
        return value
    return relax.const(value, dtype_of(like))


def _pair(v, n=2):
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


def _axes(dims, rank):
    """Reduction axes as PyTorch reads them: None and an empty list both mean all axes."""
    dims = [dims] if isinstance(dims, int) else dims
    if not dims:
        return list(range(rank))
    return sorted(d % rank for d in dims)


def unsupported(ctx, what: str, instead: str):
    raise UnsupportedOpError(f"{ctx.where}: {what} is not supported; {instead}")


# ---- elementwise arithmetic with broadcasting -------------------------------------------------
def _binary(fn):
    def convert(ctx, node, a, b, alpha=1):
        if not isinstance(a, relax.Expr):
            a = as_expr(a, b)
        b = as_expr(b, a)
        if alpha != 1:
            b = ctx.emit(R.multiply(b, relax.const(alpha, dtype_of(b))))
        return ctx.emit(fn(a, b))
    return convert


converts(aten.add.Tensor, aten.add.Scalar)(_binary(R.add))
converts(aten.sub.Tensor, aten.sub.Scalar)(_binary(R.subtract))
converts(aten.mul.Tensor, aten.mul.Scalar)(_binary(R.multiply))
converts(aten.div.Tensor, aten.div.Scalar)(_binary(R.divide))


@converts(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, node, a, b, alpha=1):
    """`rsub(a, b, alpha) = b - alpha * a` (what `2.0 - x` exports to)."""
    return _binary(R.subtract)(ctx, node, b, a, alpha)


@converts(aten.neg.default)
def _neg(ctx, node, x):
    return ctx.emit(R.negative(x))


# ---- activations ------------------------------------------------------------------------------
@converts(aten.relu.default)
def _relu(ctx, node, x):
    return ctx.emit(R.nn.relu(x))


@converts(aten.hardtanh.default)
def _hardtanh(ctx, node, x, min_val=-1.0, max_val=1.0):
    return ctx.emit(R.clip(x, float(min_val), float(max_val)))


@converts(aten.relu6.default)
def _relu6(ctx, node, x):
    return ctx.emit(R.clip(x, 0.0, 6.0))


@converts(aten.sigmoid.default)
def _sigmoid(ctx, node, x):
    return ctx.emit(R.sigmoid(x))


@converts(aten.tanh.default)
def _tanh(ctx, node, x):
    return ctx.emit(R.tanh(x))


@converts(aten.silu.default)
def _silu(ctx, node, x):
    return ctx.emit(R.nn.silu(x))


@converts(aten.hardswish.default)
def _hardswish(ctx, node, x):
    gate = ctx.emit(R.clip(ctx.emit(R.add(x, as_expr(3.0, x))), 0.0, 6.0))
    return ctx.emit(R.divide(ctx.emit(R.multiply(x, gate)), as_expr(6.0, x)))


@converts(aten.gelu.default)
def _gelu(ctx, node, x, approximate="none"):
    # One op each, so that the backward (training/gradients.py) keeps only x alive.
    if approximate == "tanh":
        return ctx.emit(R.nn.gelu_tanh(x))
    if approximate == "none":
        return ctx.emit(R.nn.gelu(x))
    unsupported(ctx, f"GELU approximate={approximate!r}", "use 'none' or 'tanh'")


# ---- linear algebra and convolution -----------------------------------------------------------
@converts(aten.linear.default)
def _linear(ctx, node, x, w, b=None):
    y = ctx.emit(R.matmul(x, ctx.emit(R.permute_dims(w, [1, 0]))))
    return ctx.emit(R.add(y, b)) if b is not None else y


def _conv_padding(ctx, padding, kernel, dilation) -> list[int]:
    """[top, left, bottom, right] for integer padding, "valid" or "same". For "same",
    PyTorch splits `dilation * (kernel - 1)` with the odd one at the end."""
    if padding == "valid":
        return [0, 0, 0, 0]
    if padding == "same":
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]
    if isinstance(padding, str):
        unsupported(ctx, f"conv padding={padding!r}", "use integers, 'valid' or 'same'")
    ph, pw = _pair(padding)
    return [ph, pw, ph, pw]


def _conv2d(ctx, x, w, b, stride, padding, dilation, groups):
    dilation = _pair(dilation)
    pad = _conv_padding(ctx, padding, shape_of(w)[2:], dilation)
    y = ctx.emit(R.nn.conv2d(x, w, strides=_pair(stride), padding=pad, dilation=dilation,
                             groups=groups))
    if b is not None:
        y = ctx.emit(R.add(y, ctx.emit(R.reshape(b, (1, shape_of(b)[0], 1, 1)))))
    return y


@converts(aten.conv2d.default, aten.conv2d.padding)
def _conv2d_aten(ctx, node, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv2d(ctx, x, w, b, stride, padding, dilation, groups)


@converts(aten.conv1d.default, aten.conv1d.padding)
def _conv1d(ctx, node, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Conv1d is a Conv2d over a height of one."""
    n, c, length = shape_of(x)
    o, i, k = shape_of(w)
    x4 = ctx.emit(R.reshape(x, (n, c, 1, length)))
    w4 = ctx.emit(R.reshape(w, (o, i, 1, k)))
    pad = padding if isinstance(padding, str) else [0, _pair(padding, 1)[0]]
    y = _conv2d(ctx, x4, w4, b, [1, _pair(stride, 1)[0]], pad, [1, _pair(dilation, 1)[0]], groups)
    _, _, _, out_len = shape_of(y)
    return ctx.emit(R.reshape(y, (n, o, out_len)))


# ---- normalisation ----------------------------------------------------------------------------
def _normalize(ctx, x, mean, var, eps):
    centered = ctx.emit(R.subtract(x, mean))
    std = ctx.emit(R.sqrt(ctx.emit(R.add(var, as_expr(eps, x)))))
    return ctx.emit(R.divide(centered, std))


def _channel(ctx, v, rank):
    return ctx.emit(R.reshape(v, (1, shape_of(v)[0]) + (1,) * (rank - 2)))


def _affine(ctx, y, w, b, reshape):
    if w is not None:
        y = ctx.emit(R.multiply(y, reshape(w)))
    if b is not None:
        y = ctx.emit(R.add(y, reshape(b)))
    return y


@converts(aten._native_batch_norm_legit_functional.default)
def _batch_norm_train(ctx, node, x, w, b, running_mean, running_var, training, momentum, eps):
    """One fused op, one kernel each way (training/batch_norm.py). aten's outputs: y, the
    batch mean and inverse std, the new running mean and variance."""
    if math.prod(shape_of(x)) // shape_of(x)[1] < 2:
        unsupported(ctx, "BatchNorm in training mode over a single value per channel",
                    "use a batch with more than one value per channel")
    return batch_norm_train(ctx.bb, x, w, b, running_mean, running_var, momentum, eps)


@converts(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(ctx, node, x, w, b, running_mean, running_var, momentum, eps):
    rank = len(shape_of(x))
    mean, var = _channel(ctx, running_mean, rank), _channel(ctx, running_var, rank)
    y = _affine(ctx, _normalize(ctx, x, mean, var, eps), w, b, lambda v: _channel(ctx, v, rank))
    return (y, mean, var)


@converts(aten.layer_norm.default)
def _layer_norm(ctx, node, x, normalized_shape, w=None, b=None, eps=1e-5, cudnn_enable=False):
    """One fused op, one kernel each way (training/layer_norm.py)."""
    if len(normalized_shape) >= len(shape_of(x)):
        unsupported(ctx, f"LayerNorm over every dimension of a {len(shape_of(x))}-d input",
                    "normalize the trailing dimensions of an input with a batch dimension")
    return layer_norm(ctx.bb, x, w, b, len(normalized_shape), eps)


# ---- pooling and reductions -------------------------------------------------------------------
@converts(aten.max_pool2d.default)
def _max_pool2d(ctx, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    ph, pw = _pair(padding)
    return ctx.emit(R.nn.max_pool2d(x, _pair(kernel), _pair(stride or kernel), [ph, pw, ph, pw],
                                    _pair(dilation), ceil_mode=ceil_mode))


@converts(aten.avg_pool2d.default)
def _avg_pool2d(ctx, node, x, kernel, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        unsupported(ctx, "AvgPool2d divisor_override", "leave divisor_override unset")
    ph, pw = _pair(padding)
    return ctx.emit(R.nn.avg_pool2d(x, _pair(kernel), _pair(stride or kernel), [ph, pw, ph, pw],
                                    ceil_mode=ceil_mode, count_include_pad=count_include_pad))


@converts(aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(ctx, node, x, output_size):
    if tuple(_pair(output_size)) != (1, 1):
        unsupported(ctx, f"AdaptiveAvgPool2d({output_size})",
                    "AdaptiveAvgPool2d(1) (global average pooling) is supported")
    return ctx.emit(R.mean(x, axis=[2, 3], keepdims=True))


@converts(aten.mean.dim, aten.mean.default)
def _mean(ctx, node, x, dims=None, keepdim=False, dtype=None):
    return ctx.emit(R.mean(x, axis=_axes(dims, len(shape_of(x))), keepdims=keepdim))


@converts(aten.sum.dim_IntList, aten.sum.default)
def _sum(ctx, node, x, dims=None, keepdim=False, dtype=None):
    return ctx.emit(R.sum(x, axis=_axes(dims, len(shape_of(x))), keepdims=keepdim))


# ---- layout -----------------------------------------------------------------------------------
def _reshape_to(ctx, x, shape):
    shape = list(shape)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        shape[shape.index(-1)] = math.prod(shape_of(x)) // known
    return ctx.emit(R.reshape(x, tuple(shape)))


@converts(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _view(ctx, node, x, shape):
    return _reshape_to(ctx, x, shape)


@converts(aten.flatten.using_ints)
def _flatten(ctx, node, x, start=0, end=-1):
    shape = shape_of(x)
    start, end = start % len(shape), end % len(shape)
    return _reshape_to(ctx, x, shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:])


@converts(aten.unsqueeze.default)
def _unsqueeze(ctx, node, x, dim):
    shape = list(shape_of(x))
    shape.insert(dim % (len(shape) + 1), 1)
    return _reshape_to(ctx, x, shape)


@converts(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(ctx, node, x, dims=None):
    shape = shape_of(x)
    if dims is None:  # x.squeeze(): every axis of size one
        dims = range(len(shape))
    dims = {d % len(shape) for d in ([dims] if isinstance(dims, int) else dims)}
    return _reshape_to(ctx, x, [s for i, s in enumerate(shape) if not (i in dims and s == 1)])


@converts(aten.permute.default)
def _permute(ctx, node, x, dims):
    return ctx.emit(R.permute_dims(x, [d % len(shape_of(x)) for d in dims]))


@converts(aten.transpose.int)
def _transpose(ctx, node, x, d0, d1):
    axes = list(range(len(shape_of(x))))
    d0, d1 = d0 % len(axes), d1 % len(axes)
    axes[d0], axes[d1] = axes[d1], axes[d0]
    return ctx.emit(R.permute_dims(x, axes))


@converts(aten.t.default)
def _t(ctx, node, x):
    return ctx.emit(R.permute_dims(x, [1, 0])) if len(shape_of(x)) == 2 else x


@converts(aten.clone.default, aten.alias.default, aten.contiguous.default)
def _identity(ctx, node, x, *args, **kwargs):
    return x


@converts(aten.cat.default)
def _cat(ctx, node, tensors, dim=0):
    return ctx.emit(R.concat(list(tensors), axis=dim % len(shape_of(tensors[0]))))


# ---- dropout ----------------------------------------------------------------------------------
@converts(aten.native_dropout.default)
def _native_dropout(ctx, node, x, p, train):
    if not train or p == 0:
        return (x, None)
    if p >= 1:
        unsupported(ctx, f"Dropout(p={p})", "use a probability below 1")
    mask = relax.Var(f"dropout_mask_{len(ctx.dropout_masks)}", x.ty)
    ctx.dropout_masks.append((mask, float(p)))
    # The mask holds 0 or 1/(1-p), drawn by the C runtime (ub_dropout_mask) every step.
    return (ctx.emit(R.multiply(x, mask)), mask)


@converts(aten.dropout.default)
def _dropout(ctx, node, x, p, train):
    return _native_dropout(ctx, node, x, p, train)[0]


@converts(operator.getitem)
def _getitem(ctx, node, values, index):
    return values[index]
