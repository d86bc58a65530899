"""The float training graph rewritten into NITI's integer one (precision="int8").

The rewrite walks `main` of the training module (trace: forward, loss, Relax's Gradient) and
gives every float tensor an integer form:

- an activation or error is int8 values with an int32 exponent of shape (1,): `Quantized`
  (value = q 2^e);
- a conv or matmul gives an int32 accumulator whose exponent is the sum of its operands':
  `Accumulator`. It stays int32 while a bias joins it (aligned: niti/align.py align_bias) and
  where it is a gradient (a weight's or a bias's: the optimizer renormalizes it); any other
  consumer reads it narrowed to int8 at a rescale site of its own (ops/niti.py `rescale`);
- a weight is an int8 parameter, a bias an int32 one, each with an exponent parameter;
- a ReLU's mask, max pooling, reshapes, transposes and broadcasts work on the int8 values as
  they are;
- an average (pooling over windows that tile, a mean over height and width, and the division
  of their backward) is an int32 sum times round(2^16 / n) at exponent e - 16
  (niti/pooling.py), an accumulator like a conv's.

The result is a Relax function with the integer parameters, one int32[6] parameter per
rescale site (returned updated, for the step to copy back), the float loss and one int32
gradient per trained parameter. Every op it does not know is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from ..errors import UnsupportedOpError
from ..niti import batch_norm as bn
from ..niti.pooling import AVERAGE_BITS, reciprocal
from ..niti.rescale import EXACT
from ..ops import niti
from ..ops.fused_ops import fused_op_of

INT8, INT32 = "int8", "int32"


@dataclass
class Quantized:
    q: relax.Expr  # int8
    e: relax.Expr  # int32 (1,)


@dataclass
class Accumulator:
    total: relax.Expr  # int32
    exponents: list  # int32 (1,) tensors whose sum is its exponent
    error_sum: bool = False  # an error summed over the batch (a bias's gradient)
    view: tuple | None = None  # (accumulator, make): a reshape of it, narrowed as it is


@dataclass
class Parameter:
    name: str
    var: relax.Var  # int8 (a weight) or int32 (a bias, a BatchNorm's running statistic)
    e: relax.Var | None  # None: a count (BatchNorm's num_batches_tracked), no exponent


@dataclass
class ZeroGradient:
    """A parameter's adjoint that Relax knows to be zero (its layer reads only padding)."""

    shape: tuple[int, ...]


@dataclass
class BatchNormSaved:
    """What an integer BatchNorm's backward reads from its forward (niti/batch_norm.py)."""

    x_hat: relax.Expr  # int8 at exponent -F
    r: relax.Expr  # int64 [C]
    g: relax.Expr  # int32 [C]
    x_e: relax.Expr  # the input's exponent


@dataclass
class Mask:
    mask: relax.Expr  # bool


def _shape(expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _moved(value):
    """A buffer's new value as the step returns it (a count is kept as a Parameter)."""
    return value.var if isinstance(value, Parameter) else value


class _Rewriter:
    def __init__(self, func: relax.Function, mode: int, max_interval: int):
        self.func, self.mode, self.max_interval = func, mode, max_interval
        self.bb = relax.BlockBuilder()
        self.env: dict = {}  # float var -> its integer form
        self.narrowed: dict[int, Quantized] = {}  # id(Accumulator) -> its int8 form
        self.kept: list = []  # each narrowed Accumulator, alive: its id is not reused
        self.sites: list[tuple[str, relax.Var]] = []
        self.new_sites: list[relax.Expr] = []
        self.zero_exponent = relax.const(np.zeros(1, np.int32))

    # ---- values ----------------------------------------------------------------------------
    def emit(self, expr, name: str = ""):
        return self.bb.emit(expr, name)

    def quantized(self, value, where: str) -> Quantized:
        """`value` as int8: an accumulator is narrowed at a rescale site of its own, once."""
        if isinstance(value, Quantized):
            return value
        if isinstance(value, Accumulator):
            if id(value) not in self.narrowed:
                self.kept.append(value)
                if value.view is not None:  # one site for the sum and its reshapes
                    origin, make = value.view
                    q = self.quantized(origin, where)
                    self.narrowed[id(value)] = Quantized(self.emit(make(q.q)), q.e)
                else:
                    self.narrowed[id(value)] = self.rescale(value, where)
            return self.narrowed[id(value)]
        raise UnsupportedOpError(f"precision='int8': {where} reads {type(value).__name__}, "
                                 "which has no int8 form")

    def rescale(self, acc: Accumulator, where: str) -> Quantized:
        if self.mode == EXACT:  # predict: no site
            out = self.emit(niti.rescale_exact(acc.total, acc.exponents), "narrowed")
            return Quantized(self.emit(relax.TupleGetItem(out, 0)),
                             self.emit(relax.TupleGetItem(out, 1)))
        site = relax.Var(f"site{len(self.sites)}", niti.SITE_TYPE)
        self.sites.append((where, site))
        out = self.emit(niti.rescale(acc.total, acc.exponents, site, self.mode,
                                     self.max_interval), "narrowed")
        self.new_sites.append(self.emit(relax.TupleGetItem(out, 2)))
        return Quantized(self.emit(relax.TupleGetItem(out, 0)),
                         self.emit(relax.TupleGetItem(out, 1)))

    def operand(self, value, where: str) -> tuple[relax.Expr, list]:
        """An int8 operand of a product and its exponent tensors."""
        if isinstance(value, Parameter):
            if _dtype(value.var) != INT8:
                raise UnsupportedOpError(f"precision='int8': {where} multiplies by the bias "
                                         f"{value.name}")
            return value.var, [value.e]
        q = self.quantized(value, where)
        return q.q, [q.e]

    # ---- the walk --------------------------------------------------------------------------
    def outputs(self):
        body = self.func.body.body  # (loss, (adjoints...))
        fields = body.fields if isinstance(body, relax.Tuple) else None
        if fields is None:
            raise UnsupportedOpError("precision='int8': the step's outputs are not a tuple")
        first, buffers = fields[0], []
        if isinstance(first, relax.Tuple):  # (loss, the buffers the step moved...)
            first, *moved = first.fields
            buffers = [_moved(self.env[b]) for b in moved]
        loss = self.env[first]
        grads = []
        for adjoint in fields[1].fields:
            value = self.env[adjoint]
            if isinstance(value, ZeroGradient):  # NITI's update leaves the parameter as it is
                grads.append(self.emit(relax.op.zeros(value.shape, INT32)))
            elif isinstance(value, Accumulator) and (value.error_sum or len(_shape(value.total))
                                                   > 1):
                grads.append(value.total)  # a weight's (products) or a bias's (error sum)
            elif isinstance(value, (Accumulator, Quantized)) and len(_shape(
                    value.total if isinstance(value, Accumulator) else value.q)) == 1:
                # a bias's gradient whose sum Relax left out (one term: batch 1, one pixel):
                # the error itself, narrowed as every error is
                q = self.quantized(value, "a bias gradient")
                grads.append(self.emit(R.astype(q.q, INT32)))
            else:
                raise UnsupportedOpError("precision='int8': a gradient that is not an "
                                         "integer sum")
        return loss, buffers, grads

    def visit(self, binding):
        value = binding.value
        if isinstance(value, relax.Var):
            return self.env[value]
        if isinstance(value, relax.TupleGetItem):
            return self.env[value.tuple_value][value.index]
        if isinstance(value, relax.Tuple):
            return [self.env.get(f, f) for f in value.fields]
        if not isinstance(value, relax.Call):
            raise UnsupportedOpError(f"precision='int8': {binding.var.name} is a "
                                     f"{type(value).__name__}")
        fused = fused_op_of(value)
        if fused is not None:
            return self.fused(value, *fused)
        op = value.op.name
        rule = RULES.get(op)
        if rule is None:
            raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {op} "
                                     f"({binding.var.name})")
        return rule(self, value, binding.var.name)

    def fused(self, call, op, attrs=None):
        args = [self.env[a] for a in call.args[1].fields]
        if op == "batch_norm_train":
            return _batch_norm_train(self, args, attrs or {})
        if op == "batch_norm_train_backward":
            return _batch_norm_backward(self, args)
        if op == "softmax_cross_entropy":
            logits, labels = self.quantized(args[0], "the logits"), args[1]
            out = self.emit(niti.softmax_xent_grad(logits.q, logits.e, labels), "xent")
            self.error = Quantized(self.emit(relax.TupleGetItem(out, 0)), self.zero_exponent)
            return self.emit(relax.TupleGetItem(out, 1), "loss")
        if op == "softmax_cross_entropy_backward":
            return self.error
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {op}")


# ---- op rules: (rewriter, float call, name) -> integer form ------------------------------------

def _per_channel(rw: _Rewriter, vector, like):
    """An int [C] vector as int32 [1, C, 1, ...], broadcast over `like`'s other axes."""
    shape = [1] * len(_shape(like))
    shape[1] = -1
    return rw.emit(R.reshape(rw.emit(R.astype(vector, INT32)), shape))


def _channel_sum(rw: _Rewriter, total):
    """An int32 [B, C, ...] summed over every axis but the channels'."""
    axes = [0] + list(range(2, len(_shape(total))))
    return rw.emit(R.sum(total, axis=axes))


def _batch_norm_train(rw: _Rewriter, args, attrs):
    """NITI's integer BatchNorm (niti/batch_norm.py): x_hat from batch statistics, then
    gamma x_hat + beta as an accumulator; the running statistics moved."""
    x, gamma, beta, mean, var = args
    if not all(isinstance(p, Parameter) for p in (gamma, beta, mean, var)):
        raise UnsupportedOpError("precision='int8': a BatchNorm without affine parameters and "
                                 "running statistics (affine=True, track_running_stats=True)")
    q = rw.quantized(x, "a BatchNorm's input")
    out = rw.emit(niti.batch_norm_train(q.q, q.e, mean.var, var.var, mean.e, var.e,
                                        attrs.get("momentum", 0.1)))
    x_hat, r, g, new_mean, new_var = (rw.emit(relax.TupleGetItem(out, i)) for i in range(5))
    product = rw.emit(R.multiply(rw.emit(R.astype(x_hat, INT32)),
                                 _per_channel(rw, gamma.var, x_hat)))
    scaled = Accumulator(product, [gamma.e, relax.const(np.array([-bn.F], np.int32))])
    total = rw.emit(niti.align_bias(scaled.total, scaled.exponents, beta.var, beta.e))
    y = Accumulator(rw.emit(relax.TupleGetItem(total, 0)),
                    [*scaled.exponents, rw.emit(relax.TupleGetItem(total, 1))])
    return [y, BatchNormSaved(x_hat, r, g, q.e), None, new_mean, new_var]


def _batch_norm_backward(rw: _Rewriter, args):
    """(dx, dgamma, dbeta): gamma's and beta's int32 sums; dx from x_hat's error narrowed."""
    _, gamma, saved, _, dy = args
    err = rw.quantized(dy, "a BatchNorm's output error")
    wide = rw.emit(R.astype(err.q, INT32))
    d_gamma = Accumulator(_channel_sum(rw, rw.emit(R.multiply(
        wide, rw.emit(R.astype(saved.x_hat, INT32))))), [err.e], error_sum=True)
    d_beta = Accumulator(_channel_sum(rw, wide), [err.e], error_sum=True)
    d_hat = rw.quantized(Accumulator(rw.emit(R.multiply(
        wide, _per_channel(rw, gamma.var, wide))), [err.e, gamma.e]), "a BatchNorm's x_hat")
    dx = rw.emit(niti.batch_norm_backward(d_hat.q, saved.x_hat, saved.r, saved.g))
    return [Accumulator(dx, [d_hat.e, relax.const(np.array([-2 * bn.F], np.int32)),
                             rw.emit(R.negative(saved.x_e))]), d_gamma, d_beta]


def _conv2d(rw: _Rewriter, call, name):
    a = call.attrs
    x, ex = rw.operand(rw.env[call.args[0]], name)
    w, ew = rw.operand(rw.env[call.args[1]], name)
    total = rw.emit(R.nn.conv2d(x, w, a.strides, a.padding, a.dilation, a.groups,
                                a.data_layout, a.kernel_layout, a.out_layout, out_dtype=INT32))
    return Accumulator(total, ex + ew)


def _conv2d_transpose(rw: _Rewriter, call, name):
    a = call.attrs
    x, ex = rw.operand(rw.env[call.args[0]], name)
    w, ew = rw.operand(rw.env[call.args[1]], name)
    total = rw.emit(R.nn.conv2d_transpose(x, w, a.strides, a.padding, a.output_padding,
                                          a.dilation, a.groups, a.data_layout, a.kernel_layout,
                                          a.out_layout, out_dtype=INT32))
    return Accumulator(total, ex + ew)


def _matmul(rw: _Rewriter, call, name):
    x, ex = rw.operand(rw.env[call.args[0]], name)
    w, ew = rw.operand(rw.env[call.args[1]], name)
    return Accumulator(rw.emit(R.matmul(x, w, out_dtype=INT32)), ex + ew)


# ops that keep an accumulator a sum: narrowing it later narrows the same numbers. Any other
# op reads it narrowed as a whole (a crop of an activation for a strided conv's weight
# gradient reads the int8 values the forward read)
KEEPS_SUM = ("relax.reshape",)


def _same_on_values(make):
    """An op that moves int8 values (reshape, transpose): the same op, the same exponent;
    of a parameter, the parameter's values moved."""
    def rule(rw: _Rewriter, call, name):
        value = rw.env[call.args[0]]
        if isinstance(value, Parameter):
            return Parameter(value.name, rw.emit(make(value.var, call)), value.e)
        if isinstance(value, Accumulator) and call.op.name in KEEPS_SUM:
            return Accumulator(rw.emit(make(value.total, call)), value.exponents,
                               value.error_sum, (value, lambda x: make(x, call)))
        q = rw.quantized(value, name)
        return Quantized(rw.emit(make(q.q, call)), q.e)
    return rule


@dataclass
class _Centered:
    """x - a BatchNorm's running mean (evaluation), waiting for its division."""

    x: object
    mean: Parameter


@dataclass
class _Spread:
    """A BatchNorm's running variance (plus eps, its square root: evaluation)."""

    var: Parameter


def _vector_of(rw: _Rewriter, p: Parameter):
    return rw.emit(R.reshape(p.var, (_shape(p.var)[1],))) if len(_shape(p.var)) > 1 else p.var


def _subtract(rw: _Rewriter, call, name):
    x, mean = (rw.env[a] for a in call.args)
    if not isinstance(mean, Parameter):
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {name}, a "
                                 "subtraction other than a BatchNorm's mean")
    return _Centered(x, mean)


def _sqrt(rw: _Rewriter, call, name):
    value = rw.env[call.args[0]]
    if not isinstance(value, _Spread):
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {name}, a "
                                 "square root other than a BatchNorm's")
    return value


def _batch_norm_eval(rw: _Rewriter, centered: _Centered, spread: _Spread, name) -> Quantized:
    q = rw.quantized(centered.x, name)
    mean, var = centered.mean, spread.var
    x_hat = rw.emit(niti.batch_norm_eval(q.q, q.e, _vector_of(rw, mean), _vector_of(rw, var),
                                         mean.e, var.e))
    return Quantized(x_hat, relax.const(np.array([-bn.F], np.int32)))


def _multiply(rw: _Rewriter, call, name):
    """x_hat times a BatchNorm's gamma (evaluation): an accumulator."""
    q, gamma = (rw.env[a] for a in call.args)
    if not isinstance(gamma, Parameter) or _dtype(gamma.var) != INT8:
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {name}, a "
                                 "product other than a BatchNorm's gamma")
    q = rw.quantized(q, name)
    return Accumulator(rw.emit(R.multiply(rw.emit(R.astype(q.q, INT32)),
                                          rw.emit(R.astype(gamma.var, INT32)))),
                       [q.e, gamma.e])


def _add(rw: _Rewriter, call, name):
    if _dtype(call) == "int64":  # a BatchNorm's num_batches_tracked + 1
        count = rw.env[call.args[0]]
        return Parameter(count.name, rw.emit(R.add(count.var, call.args[1])), None)
    if isinstance(call.args[1], tvm.ir.Constant):  # a BatchNorm's running variance + eps
        var = rw.env[call.args[0]]
        if isinstance(var, Parameter):
            return _Spread(var)
    a, b = (rw.env[x] for x in call.args)
    if isinstance(b, Accumulator) and isinstance(a, Parameter):
        a, b = b, a
    if isinstance(a, Accumulator) and isinstance(b, Parameter):  # a bias
        bias = b.var
        if len(_shape(bias)) != 1:
            bias = rw.emit(R.reshape(bias, (_shape(bias)[1],)))
        out = rw.emit(niti.align_bias(a.total, a.exponents, bias, b.e))
        return Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                           [*a.exponents, rw.emit(relax.TupleGetItem(out, 1))])
    qa, qb = rw.quantized(a, name), rw.quantized(b, name)
    out = rw.emit(niti.align_add(qa.q, qa.e, qb.q, qb.e))
    return Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                       [rw.emit(relax.TupleGetItem(out, 1))])


def _concat(rw: _Rewriter, call, name):
    tensors = call.args[0]
    fields = tensors.fields if isinstance(tensors, relax.Tuple) else rw.env[tensors]
    parts = [rw.quantized(rw.env.get(f, f), name) for f in fields]
    axis = int(call.attrs.axis) % len(_shape(parts[0].q))
    out = rw.emit(niti.align_concat([(p.q, p.e) for p in parts], axis))
    return Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                       [rw.emit(relax.TupleGetItem(out, 1))])


def _split(rw: _Rewriter, call, name):
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


def _relu(rw: _Rewriter, call, name):
    q = rw.quantized(rw.env[call.args[0]], name)
    return Quantized(rw.emit(R.maximum(q.q, relax.const(0, INT8))), q.e)


def _greater_than_zero(rw: _Rewriter, call, name):
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
    if isinstance(arg, tvm.ir.Constant) and not _shape(arg):
        return float(arg.value.numpy())
    return None


def _integer_bound(arg, name) -> int:
    value = _scalar(arg)
    if value is None or value <= 0 or value != int(value):
        raise UnsupportedOpError(f"precision='int8': {name} clips at {value}; an integer "
                                 "form exists for a positive integer bound (ReLU6)")
    return int(value)


def _clip(rw: _Rewriter, call, name):
    """ReLU6 (a clip to [0, m], m a positive integer): on int8 values, m's code at the
    input's exponent (niti/rounding.py int8_bound) as the upper bound."""
    if _scalar(call.args[1]) != 0.0:
        raise UnsupportedOpError(f"precision='int8': {name} clips from other than 0")
    bound = _integer_bound(call.args[2], name)
    q = rw.quantized(rw.env[call.args[0]], name)
    top = rw.emit(niti.int8_bound(q.e, bound))
    return Quantized(rw.emit(R.minimum(rw.emit(R.maximum(q.q, relax.const(0, INT8))), top)),
                     q.e)


def _less(rw: _Rewriter, call, name):
    """ReLU6's backward mask: below the bound, compared on int8 codes."""
    q = rw.quantized(rw.env[call.args[0]], name)
    top = rw.emit(niti.int8_bound(q.e, _integer_bound(call.args[1], name)))
    return Mask(rw.emit(R.less(q.q, top)))


def _logical_and(rw: _Rewriter, call, name):
    a, b = (rw.env[x] for x in call.args)
    if not (isinstance(a, Mask) and isinstance(b, Mask)):
        raise UnsupportedOpError(f"precision='int8': {name} joins other than two masks")
    return Mask(rw.emit(R.logical_and(a.mask, b.mask)))


def _where(rw: _Rewriter, call, name):
    mask, value, other = (rw.env.get(a, a) for a in call.args)
    if not (isinstance(mask, Mask) and isinstance(other, tvm.ir.Constant)
            and float(other.value.numpy()) == 0.0):
        raise UnsupportedOpError(f"precision='int8': {name} selects other than an error "
                                 "by a mask")
    q = rw.quantized(value, name)
    return Quantized(rw.emit(R.where(mask.mask, q.q, relax.const(0, INT8))), q.e)


def _max_pool2d(rw: _Rewriter, call, name):
    a = call.attrs
    q = rw.quantized(rw.env[call.args[0]], name)
    return Quantized(rw.emit(R.nn.max_pool2d(q.q, a.pool_size, a.strides, a.padding,
                                             a.dilation, a.ceil_mode, a.count_include_pad,
                                             a.layout, a.out_layout)), q.e)


def _max_pool2d_backward(rw: _Rewriter, call, name):
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


def _collapse_sum_to(rw: _Rewriter, call, name):
    err = rw.quantized(rw.env[call.args[0]], name)
    wide = rw.emit(R.astype(err.q, INT32))
    return Accumulator(rw.emit(R.collapse_sum_to(wide, call.args[1])), [err.e],
                       error_sum=True)


def _average(rw: _Rewriter, q: Quantized, total, n: int) -> Accumulator:
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


def _avg_pool2d(rw: _Rewriter, call, name):
    kh, kw = _tiling_window(call, name)
    q = rw.quantized(rw.env[call.args[0]], name)
    b, c, h, w = _shape(q.q)
    oh, ow = h // kh, w // kw
    x = rw.emit(R.astype(q.q, INT32))
    if (oh * kh, ow * kw) != (h, w):  # the rows and columns no window covers
        x = rw.emit(R.strided_slice(x, [2, 3], [0, 0], [oh * kh, ow * kw]))
    windows = rw.emit(R.reshape(x, (b, c, oh, kh, ow, kw)))
    return _average(rw, q, rw.emit(R.sum(windows, [3, 5])), kh * kw)


def _avg_pool2d_backward(rw: _Rewriter, call, name):
    kh, kw = _tiling_window(call, name)
    err = rw.quantized(rw.env[call.args[0]], name)
    b, c, oh, ow = _shape(err.q)
    h, w = _shape(call.args[1])[2:]
    share = _average(rw, err, rw.emit(R.astype(err.q, INT32)), kh * kw)
    tall = rw.emit(R.reshape(share.total, (b, c, oh, 1, ow, 1)))
    spread = rw.emit(R.reshape(rw.emit(R.broadcast_to(tall, (b, c, oh, kh, ow, kw))),
                               (b, c, oh * kh, ow * kw)))
    if (oh * kh, ow * kw) != (h, w):
        spread = rw.emit(R.nn.pad(spread, [0, 0, 0, 0, 0, h - oh * kh, 0, w - ow * kw]))
    return Accumulator(spread, share.exponents)


def _mean(rw: _Rewriter, call, name):
    axes = sorted(int(a) % len(_shape(call.args[0])) for a in call.attrs.axis)
    if len(_shape(call.args[0])) != 4 or axes != [2, 3]:
        raise UnsupportedOpError(f"precision='int8': {name}: a mean over axes {axes} of a "
                                 f"{len(_shape(call.args[0]))}-D tensor; only the global "
                                 "average over height and width has an integer form")
    q = rw.quantized(rw.env[call.args[0]], name)
    h, w = _shape(q.q)[2:]
    total = rw.emit(R.sum(rw.emit(R.astype(q.q, INT32)), [2, 3], call.attrs.keepdims))
    return _average(rw, q, total, h * w)


def _divide(rw: _Rewriter, call, name):
    """The division of a mean's backward: the error's share of each of n terms; or a
    BatchNorm's (evaluation) by its running statistics."""
    centered = rw.env.get(call.args[0])
    if isinstance(centered, _Centered):
        return _batch_norm_eval(rw, centered, rw.env[call.args[1]], name)
    const = call.args[1]
    n = float(const.value.numpy()) if isinstance(const, tvm.ir.Constant) \
        and not _shape(const) else 0.0
    if n < 1 or n != int(n):
        raise UnsupportedOpError(f"precision='int8': {name} divides by other than a count of "
                                 "terms (a constant integer >= 1)")
    q = rw.quantized(rw.env[call.args[0]], name)
    return _average(rw, q, rw.emit(R.astype(q.q, INT32)), int(n))


def _zeros_like(rw: _Rewriter, call, name):
    return ZeroGradient(_shape(call.args[0]))


def _ones(rw: _Rewriter, call, name):
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
    "relax.subtract": _subtract,
    "relax.sqrt": _sqrt,
    "relax.multiply": _multiply,
    "relax.ones": _ones,
    "relax.zeros_like": _zeros_like,
    "relax.zeros": lambda rw, call, name: None,  # the adjoint of a BatchNorm's statistics
}


def rewrite_step(func: relax.Function, name: str, parameters: dict[str, Parameter], mode: int,
                 max_interval: int = 1, sites: int | None = None):
    """`func` (the training function, or with mode EXACT the predict function) on integers,
    as the function `name`.

    `parameters`: by the name of the float function's parameter, its integer form. The new
    function takes the other parameters (inputs, labels) as they were, then each parameter's
    values and exponent, then the rescale sites (`sites` of them for predict, which reads
    none); the training function returns ((loss, new sites...), (int32 gradients...)),
    predict the logits as float32. Returns (function, the sites' names, in order)."""
    rw = _Rewriter(func, mode, max_interval)
    bb = rw.bb
    inputs = [relax.Var(p.name, p.ty) for p in func.params if p.name not in parameters]
    with bb.function(name):
        with bb.dataflow():
            given = iter(inputs)
            for p in func.params:
                if p.name in parameters:
                    rw.env[p] = parameters[p.name]
                    continue
                var = next(given)
                if _dtype(p) == "float32":  # a model input: quantized at the step's start
                    out = bb.emit(niti.quantize(var), "quantized")
                    rw.env[p] = Quantized(bb.emit(relax.TupleGetItem(out, 0)),
                                          bb.emit(relax.TupleGetItem(out, 1)))
                else:
                    rw.env[p] = var
            for block in func.body.blocks:
                for binding in block.bindings:
                    rw.env[binding.var] = rw.visit(binding)
            if mode == EXACT:
                logits = rw.quantized(rw.env[func.body.body], "the output")
                result = bb.emit_output(niti.dequantize(logits.q, logits.e))
            else:
                loss, buffers, grads = rw.outputs()
                result = bb.emit_output(relax.Tuple([relax.Tuple([loss, *buffers,
                                                                  *rw.new_sites]),
                                                     relax.Tuple(grads)]))
        site_vars = [s for _, s in rw.sites] if sites is None else [
            relax.Var(f"site{i}", niti.SITE_TYPE) for i in range(sites)]
        params = inputs + [v for p in parameters.values() for v in (p.var, p.e)
                           if v is not None]
        bb.emit_func_output(result, params=params + site_vars)
    return bb.get()[name], [w for w, _ in rw.sites]
