"""Adding integer tensors that carry different exponents: a residual add of two int8
activations (or two errors), and an int32 bias joining its layer's accumulator."""

from __future__ import annotations

import numpy as np

from .rounding import as_i64, round_shift

ALIGN_BITS = 22  # the largest left shift of an aligned int8: two such terms stay in int32


def aligned_sum(a, ea: int, b, eb: int) -> tuple[np.ndarray, int]:
    """a 2^ea + b 2^eb as (int64 sum, exponent): the operand of the larger exponent shifted
    left by the difference, at most ALIGN_BITS; beyond that the other is RoundShift'ed by
    the rest. Exact while the exponents differ by at most ALIGN_BITS."""
    if ea < eb:
        a, ea, b, eb = b, eb, a, ea
    left = min(ea - eb, ALIGN_BITS)
    return (as_i64(a) << left) + round_shift(b, ea - eb - left), ea - left


def align_bias(total, exponent: int, bias, bias_exponent: int) -> np.ndarray:
    """An accumulator (channels on axis 1) plus a bias [C] aligned to its exponent."""
    gap = bias_exponent - exponent
    b = as_i64(bias) << min(gap, ALIGN_BITS) if gap >= 0 else round_shift(bias, -gap)
    shape = [1] * total.ndim
    shape[1] = -1
    return as_i64(total) + b.reshape(shape)


def aligned_concat(parts, axis: int) -> tuple[np.ndarray, int]:
    """Int8 tensors [(q, e), ...] joined along `axis` at one exponent, as (int64, exponent):
    the exponent the aligned sum of the finest and the coarsest would have (the coarsest's
    minus at most ALIGN_BITS), each part RoundShift'ed to it (a left shift for all but parts
    finer than that)."""
    exponents = [e for _, e in parts]
    common = max(max(exponents) - ALIGN_BITS, min(exponents))
    return np.concatenate([round_shift(q, common - e) for q, e in parts], axis=axis), common
