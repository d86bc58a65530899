"""Adding integer tensors that carry different exponents: a residual add of two int8
activations (or two errors), and an int32 bias joining its layer's accumulator."""

from __future__ import annotations

import numpy as np

from .rounding import as_i64, max_bitlen, round_shift

ALIGN_BITS = 22  # the largest left shift of an aligned int8: two such terms stay in int32
BIAS_BITS = 30  # a bias shifted left stays below 2^30: with an accumulator below 2^30, the
# sum fits int32


def aligned_sum(a, ea: int, b, eb: int) -> tuple[np.ndarray, int]:
    """a 2^ea + b 2^eb as (int64 sum, exponent): the operand of the larger exponent shifted
    left by the difference, at most ALIGN_BITS; beyond that the other is RoundShift'ed by
    the rest. Exact while the exponents differ by at most ALIGN_BITS."""
    if ea < eb:
        a, ea, b, eb = b, eb, a, ea
    left = min(ea - eb, ALIGN_BITS)
    return (as_i64(a) << left) + round_shift(b, ea - eb - left), ea - left


def align_bias(total, exponent: int, bias, bias_exponent: int) -> tuple[np.ndarray, int]:
    """An accumulator (channels on axis 1) plus a bias [C]: (sum, how many bits coarser than
    `exponent` the sum is). A finer bias is RoundShift'ed to the accumulator's exponent. A
    coarser one is shifted left, but no further than keeps it below 2^BIAS_BITS; the rest of
    the gap RoundShifts the accumulator up instead (a layer whose input came out all zero or
    tiny, at a fine exponent, would otherwise wrap int32 or lose the bias's scale)."""
    gap = bias_exponent - exponent
    shape = [1] * total.ndim
    shape[1] = -1
    if gap <= 0:
        return as_i64(total) + round_shift(bias, -gap).reshape(shape), 0
    left = min(gap, max(BIAS_BITS - max_bitlen(bias), 0))
    coarser = gap - left
    return round_shift(total, coarser) + (as_i64(bias) << left).reshape(shape), coarser


def aligned_concat(parts, axis: int) -> tuple[np.ndarray, int]:
    """Int8 tensors [(q, e), ...] joined along `axis` at one exponent, as (int64, exponent):
    the exponent the aligned sum of the finest and the coarsest would have (the coarsest's
    minus at most ALIGN_BITS), each part RoundShift'ed to it (a left shift for all but parts
    finer than that)."""
    exponents = [e for _, e in parts]
    common = max(max(exponents) - ALIGN_BITS, min(exponents))
    return np.concatenate([round_shift(q, common - e) for q, e in parts], axis=axis), common
