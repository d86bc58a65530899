"""The integer ops of NITI training (precision="int8"), as fused ops of the step graph.

training/niti_graph.py rewrites the float training graph into these and into Relax's own integer ops
(conv2d, matmul and their gradients with int32 accumulators, relu, max pooling on int8).
Every int8 tensor travels with its exponent, an int32 tensor of shape (1,): value = q 2^e.
A rescale site, int32[6] (shift, interval, countdown, reductions, skips, exponent: the
fields of niti/rescale.py), is state that each narrowing op reads and returns updated.
lowering/niti_kernels.py gives each op its TE kernel.
"""

from __future__ import annotations

from tvm import relax

from .fused_ops import fused_call

SITE = 6  # int32 fields of a rescale site (niti/rescale.py)
EXPONENT_TYPE = relax.TensorType((1,), "int32")
SITE_TYPE = relax.TensorType((SITE,), "int32")


def _int8_like(x) -> relax.TensorType:
    return relax.TensorType(tuple(int(d) for d in x.ty.shape), "int8")


def quantize(x):
    """A float tensor as (int8, exponent): niti/quantize.py's rule."""
    return fused_call("niti_quantize", [x], [_int8_like(x), EXPONENT_TYPE])


def dequantize(q, e):
    """q 2^e as float32."""
    return fused_call("niti_dequantize", [q, e],
                      relax.TensorType(tuple(int(d) for d in q.ty.shape), "float32"))


def rescale(total, exponents, site, mode: int, max_interval: int):
    """An int32 accumulator whose exponent is the sum of `exponents` (tensors of shape (1,))
    narrowed to int8 at `site` with RoundShift: (int8, exponent, the site updated)."""
    return fused_call("niti_rescale", [total, *exponents, site],
                      [_int8_like(total), EXPONENT_TYPE, SITE_TYPE], mode=mode,
                      max_interval=max_interval)


def rescale_exact(total, exponents):
    """The same with the exact shift and no site (predict)."""
    return fused_call("niti_rescale_exact", [total, *exponents],
                      [_int8_like(total), EXPONENT_TYPE])


def align_add(a, ea, b, eb):
    """a 2^ea + b 2^eb (int8 each) as an int32 accumulator and its exponent: the operand of
    the larger exponent shifted left by their difference (at most ALIGN_BITS; beyond that the
    smaller one is RoundShift'ed down to the remainder)."""
    shape = tuple(int(d) for d in a.ty.shape)
    return fused_call("niti_align_add", [a, ea, b, eb],
                      [relax.TensorType(shape, "int32"), EXPONENT_TYPE])


def align_concat(parts, axis: int):
    """Int8 tensors [(q, e), ...] joined along `axis` as an int32 accumulator at one
    exponent (niti/align.py aligned_concat): (int32, exponent)."""
    shapes = [[int(d) for d in q.ty.shape] for q, _ in parts]
    shape = list(shapes[0])
    shape[axis] = sum(s[axis] for s in shapes)
    return fused_call("niti_align_concat", [q for q, _ in parts] + [e for _, e in parts],
                      [relax.TensorType(tuple(shape), "int32"), EXPONENT_TYPE], axis=axis)


def align_bias(total, exponents, bias, bias_exponent):
    """An int32 accumulator (its exponent the sum of `exponents`) plus an int32 bias with its
    own exponent, broadcast over dimension 1 (niti/align.py align_bias): (the int32 sum, how
    many bits coarser than the accumulator it is, a (1,) tensor to add to its exponents)."""
    return fused_call("niti_align_bias", [total, *exponents, bias, bias_exponent],
                      [total.ty, EXPONENT_TYPE])


def to_coarsest(total, e, axis: int, start: int = 0):
    """An accumulator whose channels along `axis` sit at per-channel weight exponents `e`,
    at the coarsest of them (niti/channel_exponents.py): (int32 total, (1,) exponent).
    `start`: the product is by a part of the weight (its rows from `start` on,
    training/channel_split.py) and `e` the whole weight's: channel c is the weight's
    start + c, the coarsest the whole weight's."""
    return fused_call("niti_to_coarsest", [total, e], [total.ty, EXPONENT_TYPE], axis=axis,
                      **_from(start))


def weight_at_coarsest(q, e, start: int = 0):
    """An int8 weight with per-channel exponents at the coarsest one: (int8, (1,)); `start`
    as to_coarsest's."""
    return fused_call("niti_weight_at_coarsest", [q, e], [q.ty, EXPONENT_TYPE], **_from(start))


def _from(start: int) -> dict:
    """The attribute only where it is set: a whole weight's kernels keep their names."""
    return {"start": start} if start else {}


def int8_bound(e, value: int):
    """The int8 code (1,) at exponent `e` of a clipping bound `value` (niti/rounding.py)."""
    return fused_call("niti_int8_bound", [e], relax.TensorType((1,), "int8"), value=value)


def softmax_xent_grad(logits, e, labels):
    """NITI's integer softmax cross-entropy gradient (niti/loss.py): (int8 error with
    exponent 0, the float loss of the dequantized logits)."""
    return fused_call("niti_softmax_xent", [logits, e, labels],
                      [_int8_like(logits), relax.TensorType((), "float32")])


def _vector(x, dtype: str) -> relax.TensorType:
    return relax.TensorType((int(x.ty.shape[1]),), dtype)


def batch_norm_train(q, e, mean, var, e_mean, e_var, momentum: float):
    """NITI's integer BatchNorm on int8 q at exponent e, with batch statistics
    (niti/batch_norm.py): (x_hat int8 at exponent -F, r int64 [C], g int32 [C], the running
    mean and variance moved, int32 [C] at their exponents e_mean and e_var)."""
    return fused_call("niti_batch_norm_train", [q, mean, var, e, e_mean, e_var],
                      [_int8_like(q), _vector(q, "int64"), _vector(q, "int32"),
                       mean.ty, var.ty], momentum=float(momentum))


def batch_norm_backward(d_hat, x_hat, r, g):
    """The error of a BatchNorm's input (int32, at d_hat's exponent - 2F - the input's) from
    the error of its x_hat and the forward's x_hat, r and g."""
    shape = tuple(int(d) for d in d_hat.ty.shape)
    return fused_call("niti_batch_norm_backward", [d_hat, x_hat, r, g],
                      relax.TensorType(shape, "int32"))


def batch_norm_eval(q, e, mean, var, e_mean, e_var):
    """x_hat (int8 at -F) of int8 q at e with the running statistics (evaluation)."""
    return fused_call("niti_batch_norm_eval", [q, e, mean, var, e_mean, e_var], _int8_like(q))


def table(q, e, values, exponents):
    """An elementwise function by compile-time table (niti/tables.py): F_e[q] and its
    exponent, `values` [rows, 256] int8 and `exponents` [rows] int32 constants."""
    return fused_call("niti_table", [q, e, values, exponents], [q.ty, EXPONENT_TYPE])


def table_grad(err, q, e, values, exponents):
    """Its backward: err D_e[q] as an int32 accumulator and the table's exponent."""
    shape = tuple(int(d) for d in err.ty.shape)
    return fused_call("niti_table_grad", [err, q, e, values, exponents],
                      [relax.TensorType(shape, "int32"), EXPONENT_TYPE])
