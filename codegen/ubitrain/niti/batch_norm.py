"""An integer BatchNorm for NITI training: batch statistics of int8 activations in int64,
no float anywhere.

Training forward, per channel c over its n = B H W int8 values q at exponent e:
    s1 = sum q,  s2 = sum q^2,  v = n s2 - s1^2       (n^2 times the variance, exact)
    r = isqrt(v 4^g)                                 (n times the standard deviation, g
                                                     fraction bits: ROOT_BITS, fewer where
                                                     v 4^g would leave int64)
    x_hat = RoundDiv((n q - s1) 2^(F + g), r)  clipped   (int8 at -F; 0 where r = 0)
then y = gamma x_hat + beta: gamma an int8 weight, beta an int32 bias (niti/align.py), an
accumulator like a conv's. PyTorch's eps is left out: in int8 units it is below 1/n of any
nonzero variance; a constant channel (r = 0) gives x_hat = 0 as PyTorch's does.

Backward, from the error dx_hat (int8 at exponent ex) of x_hat:
    m1 = sum dx_hat,  m2 = sum dx_hat x_hat
    T = (n dx_hat - m1) 2^(2F) - x_hat m2
    dx = RoundDiv(T 2^g, r)                           (int64 at exponent ex - 2F - e)
which is PyTorch's (1/sigma)(dx_hat - mean(dx_hat) - x_hat mean(dx_hat x_hat)) with sigma =
r 2^e / n, exact up to the final rounding.

Running statistics (evaluation) are int32 at fixed exponents of their own (the mean's e_m,
the variance's e_v), moved by momentum as PyTorch moves them, in fixed point
(MOMENTUM_BITS): mean += RoundShift((s1 / n - mean) M), var += RoundShift((v / (n (n - 1)) -
var) M), each batch statistic RoundDiv'ed to its exponent first.
"""

from __future__ import annotations

import math

import numpy as np

from .rounding import as_i64, bitlen, clip8, round_shift

F = 5  # x_hat's fraction bits: int8 x_hat spans +-3.97 standard deviations
ROOT_BITS = 8  # fraction bits of the square root: isqrt's floor costs at most 2^-8 / r
MOMENTUM_BITS = 16
INT32_LIMIT = 2**31 - 1  # the running statistics and dx are int32, saturated


def round_div(a, b) -> np.ndarray:
    """a / b rounded half away from zero (b >= 0 broadcast; 0 where b is 0)."""
    a, b = as_i64(a), as_i64(b)
    safe = np.where(b > 0, b, 1)
    q = np.sign(a) * ((np.abs(a) + safe // 2) // safe)
    return np.where(b > 0, q, 0)


def isqrt(v) -> np.ndarray:
    """floor(sqrt(v)) of non-negative int64s, exactly."""
    return np.array([math.isqrt(int(x)) for x in as_i64(v).reshape(-1)],
                    np.int64).reshape(np.shape(v))


def root(v) -> tuple[np.ndarray, np.ndarray]:
    """(isqrt(v 4^g), g) per channel: g = ROOT_BITS, or fewer where v 4^g passes 2^62."""
    v = as_i64(v)
    g = np.clip((62 - bitlen(v)) // 2, 0, ROOT_BITS)
    return isqrt(v << (2 * g)), g


def _channels_last(q) -> np.ndarray:
    """[B, C, ...] as [C, n]."""
    q = as_i64(q)
    return np.moveaxis(q, 1, 0).reshape(q.shape[1], -1)


def _per_channel(v, like) -> np.ndarray:
    shape = [1] * like.ndim
    shape[1] = -1
    return np.asarray(v).reshape(shape)


def statistics(q) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, s1, v) per channel of int8 values [B, C, ...]."""
    flat = _channels_last(q)
    n = flat.shape[1]
    s1, s2 = flat.sum(axis=1), (flat * flat).sum(axis=1)
    return n, s1, n * s2 - s1 * s1


def normalize(q) -> tuple[np.ndarray, tuple]:
    """(x_hat int8 at exponent -F, (r, g) per channel) of int8 values [B, C, ...]."""
    n, s1, v = statistics(q)
    r, g = root(v)
    centered = (n * as_i64(q) - _per_channel(s1, q)) << _per_channel(F + g, q)
    return clip8(round_div(centered, _per_channel(r, q))).astype(np.int8), (r, g)


def normalize_backward(dx_hat, x_hat, root_g, x_exponent: int, error_exponent: int):
    """(dx as int64, its exponent) from x_hat's error, x_hat and (r, g) (the forward's)."""
    r, g = root_g
    d, x = as_i64(dx_hat), as_i64(x_hat)
    n = d.size // d.shape[1]
    m1 = _per_channel(_channels_last(d).sum(axis=1), d)
    m2 = _per_channel((_channels_last(d) * _channels_last(x)).sum(axis=1), d)
    t = ((n * d - m1) << (2 * F)) - x * m2
    dx = np.clip(round_div(t << _per_channel(g, d), _per_channel(r, d)), -INT32_LIMIT,
                 INT32_LIMIT)
    return dx, error_exponent - 2 * F - x_exponent


def _ratio_at(a, exponent: int, b: int, target: int) -> np.ndarray:
    """a 2^exponent / b as an integer at exponent `target`, rounded once."""
    up = exponent - target
    return round_div(as_i64(a) << max(up, 0), b << max(-up, 0))


def update_running(mean, var, mean_exponent: int, var_exponent: int, q, e: int,
                   momentum: float) -> tuple[np.ndarray, np.ndarray]:
    """The running mean and (unbiased) variance after a batch of int8 values q at e."""
    n, s1, v = statistics(q)
    m = int(round(momentum * (1 << MOMENTUM_BITS)))
    batch_mean = _ratio_at(s1, e, n, mean_exponent)
    unbiased = _ratio_at(v, 2 * e, n * max(n - 1, 1), var_exponent)
    mean = as_i64(mean) + round_shift((batch_mean - as_i64(mean)) * m, MOMENTUM_BITS)
    var = as_i64(var) + round_shift((unbiased - as_i64(var)) * m, MOMENTUM_BITS)
    return (np.clip(mean, -INT32_LIMIT, INT32_LIMIT).astype(np.int32),
            np.clip(var, -INT32_LIMIT, INT32_LIMIT).astype(np.int32))


def normalize_running(q, e: int, mean, var, mean_exponent: int, var_exponent: int):
    """x_hat (int8 at -F) of int8 values q at e with the running statistics (evaluation)."""
    common = min(e, mean_exponent)
    d = (as_i64(q) << (e - common)) - _per_channel(as_i64(mean) << (mean_exponent - common), q)
    k = var_exponent - 2 * common  # the variance in units of 2^(2 common)
    r, g = root(np.maximum(round_shift(var, -k), 0))
    return clip8(round_div(d << _per_channel(F + g, q), _per_channel(r, q))).astype(np.int8)
