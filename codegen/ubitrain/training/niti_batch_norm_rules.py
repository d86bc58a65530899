"""The NITI rewrite's rules for BatchNorm with NITI(batch_norm="integer") (niti/batch_norm.py):
the fused training op and its backward, and evaluation mode's chain of ops (x - mean,
var + eps, its square root, the division, gamma's product) gathered back into one integer
BatchNorm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tvm import relax
from tvm.relax import op as R

from ..errors import UnsupportedOpError
from ..niti import batch_norm as bn
from ..ops import niti
from .niti_values import (
    INT8,
    INT32,
    Accumulator,
    BatchNormSaved,
    Parameter,
    Quantized,
    dtype_of,
    shape_of,
)

if TYPE_CHECKING:
    from .niti_graph import Rewriter


def _per_channel(rw: Rewriter, vector, like):
    """An int [C] vector as int32 [1, C, 1, ...], broadcast over `like`'s other axes."""
    shape = [1] * len(shape_of(like))
    shape[1] = -1
    return rw.emit(R.reshape(rw.emit(R.astype(vector, INT32)), shape))


def _channel_sum(rw: Rewriter, total):
    """An int32 [B, C, ...] summed over every axis but the channels'."""
    axes = [0] + list(range(2, len(shape_of(total))))
    return rw.emit(R.sum(total, axis=axes))


def batch_norm_train(rw: Rewriter, args, attrs):
    """NITI's integer BatchNorm (niti/batch_norm.py): x_hat from batch statistics, then
    gamma x_hat + beta as an accumulator (x_hat itself without affine parameters); the
    running statistics moved."""
    x, gamma, beta, mean, var = args
    if not all(isinstance(p, Parameter) for p in (mean, var)):
        raise UnsupportedOpError("precision='int8': a BatchNorm without running statistics "
                                 "(track_running_stats=True)")
    q = rw.quantized(x, "a BatchNorm's input")
    out = rw.emit(niti.batch_norm_train(q.q, q.e, mean.var, var.var, mean.e, var.e,
                                        attrs.get("momentum", 0.1)))
    x_hat, r, g, new_mean, new_var = (rw.emit(relax.TupleGetItem(out, i)) for i in range(5))
    saved = BatchNormSaved(x_hat, r, g, q.e)
    if not isinstance(gamma, Parameter):  # affine=False: y = x_hat
        return [Quantized(x_hat, relax.const(np.array([-bn.F], np.int32))), saved, None,
                new_mean, new_var]
    product = rw.emit(R.multiply(rw.emit(R.astype(x_hat, INT32)),
                                 _per_channel(rw, gamma.var, x_hat)))
    scaled = Accumulator(product, [gamma.e, relax.const(np.array([-bn.F], np.int32))])
    total = rw.emit(niti.align_bias(scaled.total, scaled.exponents, beta.var, beta.e))
    y = Accumulator(rw.emit(relax.TupleGetItem(total, 0)),
                    [*scaled.exponents, rw.emit(relax.TupleGetItem(total, 1))])
    return [y, saved, None, new_mean, new_var]


def batch_norm_backward(rw: Rewriter, args):
    """(dx, dgamma, dbeta): gamma's and beta's int32 sums; dx from x_hat's error narrowed."""
    _, gamma, saved, _, dy = args
    err = rw.quantized(dy, "a BatchNorm's output error")
    if not isinstance(gamma, Parameter):  # affine=False: the error is x_hat's
        return [_input_error(rw, err, saved), None, None]
    wide = rw.emit(R.astype(err.q, INT32))
    d_gamma = Accumulator(_channel_sum(rw, rw.emit(R.multiply(
        wide, rw.emit(R.astype(saved.x_hat, INT32))))), [err.e], error_sum=True)
    d_beta = Accumulator(_channel_sum(rw, wide), [err.e], error_sum=True)
    d_hat = rw.quantized(Accumulator(rw.emit(R.multiply(
        wide, _per_channel(rw, gamma.var, wide))), [err.e, gamma.e]), "a BatchNorm's x_hat")
    return [_input_error(rw, d_hat, saved), d_gamma, d_beta]


def _input_error(rw: Rewriter, d_hat: Quantized, saved: BatchNormSaved) -> Accumulator:
    """dx (int32, at d_hat's exponent - 2F - the input's) from x_hat's error."""
    dx = rw.emit(niti.batch_norm_backward(d_hat.q, saved.x_hat, saved.r, saved.g))
    return Accumulator(dx, [d_hat.e, relax.const(np.array([-2 * bn.F], np.int32)),
                            rw.emit(R.negative(saved.x_e))])


@dataclass
class Centered:
    """x - a BatchNorm's running mean (evaluation), waiting for its division."""

    x: object
    mean: Parameter


@dataclass
class Spread:
    """A BatchNorm's running variance (plus eps, its square root: evaluation)."""

    var: Parameter


def _vector_of(rw: Rewriter, p: Parameter):
    return rw.emit(R.reshape(p.var, (shape_of(p.var)[1],))) if len(shape_of(p.var)) > 1 else p.var


def subtract(rw: Rewriter, call, name):
    x, mean = (rw.env[a] for a in call.args)
    if not isinstance(mean, Parameter):
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {name}, a "
                                 "subtraction other than a BatchNorm's mean")
    return Centered(x, mean)


def sqrt(rw: Rewriter, call, name):
    value = rw.env[call.args[0]]
    if not isinstance(value, Spread):
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {name}, a "
                                 "square root other than a BatchNorm's")
    return value


def batch_norm_eval(rw: Rewriter, centered: Centered, spread: Spread, name) -> Quantized:
    q = rw.quantized(centered.x, name)
    mean, var = centered.mean, spread.var
    x_hat = rw.emit(niti.batch_norm_eval(q.q, q.e, _vector_of(rw, mean), _vector_of(rw, var),
                                         mean.e, var.e))
    return Quantized(x_hat, relax.const(np.array([-bn.F], np.int32)))


def multiply(rw: Rewriter, call, name):
    """x_hat times a BatchNorm's gamma (evaluation): an accumulator."""
    q, gamma = (rw.env[a] for a in call.args)
    if not isinstance(gamma, Parameter) or dtype_of(gamma.var) != INT8:
        raise UnsupportedOpError(f"precision='int8': no integer (NITI) form for {name}, a "
                                 "product other than a BatchNorm's gamma")
    q = rw.quantized(q, name)
    return Accumulator(rw.emit(R.multiply(rw.emit(R.astype(q.q, INT32)),
                                          rw.emit(R.astype(gamma.var, INT32)))),
                       [q.e, gamma.e])
