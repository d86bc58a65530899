"""The NITI rewrite's op rules (niti_graph.py): for each Relax op of the float training graph,
(rewriter, call, name) -> its integer form (niti_values.py). BatchNorm's are in
niti_batch_norm_rules.py."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from ..errors import UnsupportedOpError
from ..niti.pooling import AVERAGE_BITS, reciprocal
from ..ops import niti
from .niti_batch_norm_rules import Centered, Spread, batch_norm_eval, multiply, sqrt, subtract
from .niti_part_rules import add_parts, concat_parts, is_part, product
from .niti_values import (
    INT8,
    INT32,
    Accumulator,
    Mask,
    Parameter,
    Quantized,
    ZeroGradient,
    dtype_of,
    shape_of,
)

if TYPE_CHECKING:
    from .niti_graph import Rewriter


def _at_coarsest(rw: Rewriter, weight, channels: int, total, exponents, axis: int):
    """A product by a weight whose exponents per channel it kept (its channel axis
    `channels` was the product's `axis`) brought to the coarsest one
    (niti/channel_exponents.py); any other product as it is. A product by a part of a split
    weight is a `PartProduct` (niti_part_rules.py)."""
    if not (isinstance(weight, Parameter) and weight.channel_axis == channels):
        return product(weight, Accumulator(total, exponents))
    out = rw.emit(niti.to_coarsest(total, weight.e, axis, weight.start))
    return product(weight, Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                                       [*exponents[:-1], rw.emit(relax.TupleGetItem(out, 1))]))


def _conv2d(rw: Rewriter, call, name):
    a = call.attrs
    weight = rw.env[call.args[1]]
    x, ex = rw.operand(rw.env[call.args[0]], name)
    w, ew = rw.operand(weight, name, channels_out=0)
    total = rw.emit(R.nn.conv2d(x, w, a.strides, a.padding, a.dilation, a.groups,
                                a.data_layout, a.kernel_layout, a.out_layout, out_dtype=INT32))
    return _at_coarsest(rw, weight, 0, total, ex + ew, axis=1)


def _conv2d_transpose(rw: Rewriter, call, name):
    a = call.attrs
    weight = rw.env[call.args[1]]
    x, ex = rw.operand(rw.env[call.args[0]], name)
    w, ew = rw.operand(weight, name)
    total = rw.emit(R.nn.conv2d_transpose(x, w, a.strides, a.padding, a.output_padding,
                                          a.dilation, a.groups, a.data_layout, a.kernel_layout,
                                          a.out_layout, out_dtype=INT32))
    return product(weight, Accumulator(total, ex + ew))


def _matmul(rw: Rewriter, call, name):
    weight = rw.env[call.args[1]]
    last = len(shape_of(call.args[1])) - 1
    x, ex = rw.operand(rw.env[call.args[0]], name)
    w, ew = rw.operand(weight, name, channels_out=last)  # x W^T: W's channels come last
    total = rw.emit(R.matmul(x, w, out_dtype=INT32))
    return _at_coarsest(rw, weight, last, total, ex + ew, axis=len(shape_of(call)) - 1)


def _moved_axis(axis: int | None, call) -> int | None:
    """Where a per-channel weight's channel axis goes under a transpose; any other move of
    such a weight is refused (its channels would lose their exponents)."""
    if axis is None:
        return None
    if call.op.name == "relax.permute_dims":
        axes = call.attrs.axes
        order = [int(i) for i in axes] if axes is not None else \
            list(reversed(range(len(shape_of(call)))))
        return order.index(axis)
    raise UnsupportedOpError(f"precision='int8': {call.op.name} of a weight with an exponent "
                             "per channel")


# ops that keep an accumulator a sum: narrowing it later narrows the same numbers. Any other
# op reads it narrowed as a whole (a crop of an activation for a strided conv's weight
# gradient reads the int8 values the forward read)
KEEPS_SUM = ("relax.reshape",)


def _same_on_values(make):
    """An op that moves int8 values (reshape, transpose): the same op, the same exponent;
    of a parameter, the parameter's values moved."""
    def rule(rw: Rewriter, call, name):
        value = rw.env[call.args[0]]
        if isinstance(value, Parameter):
            return dataclasses.replace(value, var=rw.emit(make(value.var, call)),
                                       channel_axis=_moved_axis(value.channel_axis, call))
        if isinstance(value, Accumulator) and call.op.name in KEEPS_SUM:
            return Accumulator(rw.emit(make(value.total, call)), value.exponents,
                               value.error_sum, (value, lambda x: make(x, call)))
        q = rw.quantized(value, name)
        return Quantized(rw.emit(make(q.q, call)), q.e)
    return rule


def _add(rw: Rewriter, call, name):
    if dtype_of(call) == "int64":  # a BatchNorm's num_batches_tracked + 1
        count = rw.env[call.args[0]]
        return Parameter(count.name, rw.emit(R.add(count.var, call.args[1])), None)
    if isinstance(call.args[1], tvm.ir.Constant):  # a BatchNorm's running variance + eps
        var = rw.env[call.args[0]]
        if isinstance(var, Parameter):
            return Spread(var)
    a, b = (rw.env[x] for x in call.args)
    if is_part(a) or is_part(b):  # the input error of a layer split by channels
        return add_parts(rw, a, b, lambda x, y: _aligned_add(rw, x, y, name), name)
    return _aligned_add(rw, a, b, name)


def _aligned_add(rw: Rewriter, a, b, name):
    """Two integer forms added: an accumulator and a bias aligned, anything else as int8."""
    if isinstance(b, Accumulator) and isinstance(a, Parameter):
        a, b = b, a
    if isinstance(a, Accumulator) and isinstance(b, Parameter):  # a bias
        bias = b.var
        if len(shape_of(bias)) != 1:
            bias = rw.emit(R.reshape(bias, (shape_of(bias)[1],)))
        out = rw.emit(niti.align_bias(a.total, a.exponents, bias, b.e))
        return Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                           [*a.exponents, rw.emit(relax.TupleGetItem(out, 1))])
    qa, qb = rw.quantized(a, name), rw.quantized(b, name)
    out = rw.emit(niti.align_add(qa.q, qa.e, qb.q, qb.e))
    return Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                       [rw.emit(relax.TupleGetItem(out, 1))])


def _concat(rw: Rewriter, call, name):
    tensors = call.args[0]
    fields = tensors.fields if isinstance(tensors, relax.Tuple) else rw.env[tensors]
    values = [rw.env.get(f, f) for f in fields]
    if any(is_part(v) for v in values):  # a layer split by channels: its products
        return concat_parts(rw, values, int(call.attrs.axis) % len(shape_of(call)), name)
    parts = [rw.quantized(v, name) for v in values]
    axis = int(call.attrs.axis) % len(shape_of(parts[0].q))
    out = rw.emit(niti.align_concat([(p.q, p.e) for p in parts], axis))
    return Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                       [rw.emit(relax.TupleGetItem(out, 1))])


def _split(rw: Rewriter, call, name):
    """The error of a concat, back to its parts: each at the error's exponent."""
    q = rw.quantized(rw.env[call.args[0]], name)
    a = call.attrs
    sections = a.indices_or_sections
    if isinstance(sections, (int, tvm.tirx.IntImm)):  # equal sections
        sections = int(sections)
        count = sections
    else:  # split points
        sections = [int(i) for i in sections]
        count = len(sections) + 1
    out = rw.emit(R.split(q.q, sections, int(a.axis)))
    return [Quantized(rw.emit(relax.TupleGetItem(out, k)), q.e) for k in range(count)]


def _relu(rw: Rewriter, call, name):
    q = rw.quantized(rw.env[call.args[0]], name)
    return Quantized(rw.emit(R.maximum(q.q, relax.const(0, INT8))), q.e)


def _greater_than_zero(rw: Rewriter, call, name):
    const = call.args[1]
    if not (isinstance(const, tvm.ir.Constant) and float(const.value.numpy()) == 0.0):
        raise UnsupportedOpError(f"precision='int8': {name} compares with a value other "
                                 "than 0")
    q = rw.quantized(rw.env[call.args[0]], name)
    return Mask(rw.emit(R.greater(q.q, relax.const(0, INT8))))


def _scalar(arg) -> float | None:
    """The number a TIR immediate (clip's bounds) or a 0-d constant holds (None: neither)."""
    if isinstance(arg, (tvm.tirx.FloatImm, tvm.tirx.IntImm)):
        return float(arg.value)
    if isinstance(arg, tvm.ir.Constant) and not shape_of(arg):
        return float(arg.value.numpy())
    return None


def _integer_bound(arg, name) -> int:
    value = _scalar(arg)
    if value is None or value <= 0 or value != int(value):
        raise UnsupportedOpError(f"precision='int8': {name} clips at {value}; an integer "
                                 "form exists for a positive integer bound (ReLU6)")
    return int(value)


def _clip(rw: Rewriter, call, name):
    """ReLU6 (a clip to [0, m], m a positive integer): on int8 values, m's code at the
    input's exponent (niti/rounding.py int8_bound) as the upper bound."""
    if _scalar(call.args[1]) != 0.0:
        raise UnsupportedOpError(f"precision='int8': {name} clips from other than 0")
    bound = _integer_bound(call.args[2], name)
    q = rw.quantized(rw.env[call.args[0]], name)
    top = rw.emit(niti.int8_bound(q.e, bound))
    return Quantized(rw.emit(R.minimum(rw.emit(R.maximum(q.q, relax.const(0, INT8))), top)),
                     q.e)


def _less(rw: Rewriter, call, name):
    """ReLU6's backward mask: below the bound, compared on int8 codes."""
    q = rw.quantized(rw.env[call.args[0]], name)
    top = rw.emit(niti.int8_bound(q.e, _integer_bound(call.args[1], name)))
    return Mask(rw.emit(R.less(q.q, top)))


def _logical_and(rw: Rewriter, call, name):
    a, b = (rw.env[x] for x in call.args)
    if not (isinstance(a, Mask) and isinstance(b, Mask)):
        raise UnsupportedOpError(f"precision='int8': {name} joins other than two masks")
    return Mask(rw.emit(R.logical_and(a.mask, b.mask)))


def _where(rw: Rewriter, call, name):
    mask, value, other = (rw.env.get(a, a) for a in call.args)
    if not (isinstance(mask, Mask) and isinstance(other, tvm.ir.Constant)
            and float(other.value.numpy()) == 0.0):
        raise UnsupportedOpError(f"precision='int8': {name} selects other than an error "
                                 "by a mask")
    q = rw.quantized(value, name)
    return Quantized(rw.emit(R.where(mask.mask, q.q, relax.const(0, INT8))), q.e)


def _max_pool2d(rw: Rewriter, call, name):
    a = call.attrs
    q = rw.quantized(rw.env[call.args[0]], name)
    return Quantized(rw.emit(R.nn.max_pool2d(q.q, a.pool_size, a.strides, a.padding,
                                             a.dilation, a.ceil_mode, a.count_include_pad,
                                             a.layout, a.out_layout)), q.e)


def _max_pool2d_backward(rw: Rewriter, call, name):
    a = call.attrs
    if any(int(s) < int(k) for s, k in zip(a.strides, a.pool_size)):
        raise UnsupportedOpError(f"precision='int8': {name}: max pooling with overlapping "
                                 f"windows (pool {list(a.pool_size)}, stride "
                                 f"{list(a.strides)}) sums errors beyond int8")
    err = rw.quantized(rw.env[call.args[0]], name)
    x = rw.quantized(rw.env[call.args[1]], name)
    return Quantized(rw.emit(R.grad.max_pool2d_backward(
        err.q, x.q, a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode,
        a.count_include_pad, a.layout, a.out_layout)), err.e)


def _collapse_sum_to(rw: Rewriter, call, name):
    err = rw.quantized(rw.env[call.args[0]], name)
    wide = rw.emit(R.astype(err.q, INT32))
    return Accumulator(rw.emit(R.collapse_sum_to(wide, call.args[1])), [err.e],
                       error_sum=True)


def _average(rw: Rewriter, q: Quantized, total, n: int) -> Accumulator:
    """An int32 sum of n int8 terms (or one int8 term for n terms' share) as their average."""
    scaled = rw.emit(R.multiply(total, relax.const(reciprocal(n), INT32)))
    return Accumulator(scaled, [q.e, relax.const(np.array([-AVERAGE_BITS], np.int32))])


def _tiling_window(call, name) -> tuple[int, int]:
    a = call.attrs
    kernel = tuple(int(k) for k in a.pool_size)
    if tuple(int(s) for s in a.strides) != kernel or any(int(p) for p in a.padding) \
            or a.ceil_mode or any(int(d) != 1 for d in a.dilation) or a.layout != "NCHW":
        raise UnsupportedOpError(
            f"precision='int8': {name}: average pooling over windows that do not tile the "
            f"map (pool {list(a.pool_size)}, stride {list(a.strides)}, padding "
            f"{list(a.padding)}); use stride = pool size, no padding")
    return kernel


def _avg_pool2d(rw: Rewriter, call, name):
    kh, kw = _tiling_window(call, name)
    q = rw.quantized(rw.env[call.args[0]], name)
    b, c, h, w = shape_of(q.q)
    oh, ow = h // kh, w // kw
    x = rw.emit(R.astype(q.q, INT32))
    if (oh * kh, ow * kw) != (h, w):  # the rows and columns no window covers
        x = rw.emit(R.strided_slice(x, [2, 3], [0, 0], [oh * kh, ow * kw]))
    windows = rw.emit(R.reshape(x, (b, c, oh, kh, ow, kw)))
    return _average(rw, q, rw.emit(R.sum(windows, [3, 5])), kh * kw)


def _avg_pool2d_backward(rw: Rewriter, call, name):
    kh, kw = _tiling_window(call, name)
    err = rw.quantized(rw.env[call.args[0]], name)
    b, c, oh, ow = shape_of(err.q)
    h, w = shape_of(call.args[1])[2:]
    share = _average(rw, err, rw.emit(R.astype(err.q, INT32)), kh * kw)
    tall = rw.emit(R.reshape(share.total, (b, c, oh, 1, ow, 1)))
    spread = rw.emit(R.reshape(rw.emit(R.broadcast_to(tall, (b, c, oh, kh, ow, kw))),
                               (b, c, oh * kh, ow * kw)))
    if (oh * kh, ow * kw) != (h, w):
        spread = rw.emit(R.nn.pad(spread, [0, 0, 0, 0, 0, h - oh * kh, 0, w - ow * kw]))
    return Accumulator(spread, share.exponents)


def _mean(rw: Rewriter, call, name):
    axes = sorted(int(a) % len(shape_of(call.args[0])) for a in call.attrs.axis)
    if len(shape_of(call.args[0])) != 4 or axes != [2, 3]:
        raise UnsupportedOpError(f"precision='int8': {name}: a mean over axes {axes} of a "
                                 f"{len(shape_of(call.args[0]))}-D tensor; only the global "
                                 "average over height and width has an integer form")
    q = rw.quantized(rw.env[call.args[0]], name)
    h, w = shape_of(q.q)[2:]
    total = rw.emit(R.sum(rw.emit(R.astype(q.q, INT32)), [2, 3], call.attrs.keepdims))
    return _average(rw, q, total, h * w)


def _divide(rw: Rewriter, call, name):
    """The division of a mean's backward: the error's share of each of n terms; or a
    BatchNorm's (evaluation) by its running statistics."""
    centered = rw.env.get(call.args[0])
    if isinstance(centered, Centered):
        return batch_norm_eval(rw, centered, rw.env[call.args[1]], name)
    const = call.args[1]
    n = float(const.value.numpy()) if isinstance(const, tvm.ir.Constant) \
        and not shape_of(const) else 0.0
    if n < 1 or n != int(n):
        raise UnsupportedOpError(f"precision='int8': {name} divides by other than a count of "
                                 "terms (a constant integer >= 1)")
    q = rw.quantized(rw.env[call.args[0]], name)
    return _average(rw, q, rw.emit(R.astype(q.q, INT32)), int(n))


def _zeros_like(rw: Rewriter, call, name):
    return ZeroGradient(shape_of(call.args[0]))


def _ones(rw: Rewriter, call, name):
    return None  # the loss's own adjoint: the integer loss gradient does not read it


RULES = {
    "relax.nn.conv2d": _conv2d,
    "relax.nn.conv2d_transpose": _conv2d_transpose,
    "relax.matmul": _matmul,
    "relax.reshape": _same_on_values(lambda x, c: R.reshape(x, c.args[1])),
    "relax.permute_dims": _same_on_values(lambda x, c: R.permute_dims(x, c.attrs.axes)),
    "relax.add": _add,
    "relax.concat": _concat,
    "relax.split": _split,
    "relax.nn.relu": _relu,
    "relax.greater": _greater_than_zero,
    "relax.clip": _clip,
    "relax.less": _less,
    "relax.logical_and": _logical_and,
    "relax.where": _where,
    "relax.nn.max_pool2d": _max_pool2d,
    "relax.grad.max_pool2d_backward": _max_pool2d_backward,
    "relax.collapse_sum_to": _collapse_sum_to,
    "relax.broadcast_to": _same_on_values(lambda x, c: R.broadcast_to(x, c.args[1])),
    "relax.strided_slice": _same_on_values(lambda x, c: relax.Call(c.op, [x, *c.args[1:]],
                                                                  c.attrs)),
    "relax.nn.avg_pool2d": _avg_pool2d,
    "relax.grad.avg_pool2d_backward": _avg_pool2d_backward,
    "relax.mean": _mean,
    "relax.divide": _divide,
    "relax.subtract": subtract,
    "relax.sqrt": sqrt,
    "relax.multiply": multiply,
    "relax.ones": _ones,
    "relax.zeros_like": _zeros_like,
    "relax.zeros": lambda rw, call, name: None,  # the adjoint of a BatchNorm's statistics
}
