"""NITI's update of a parameter from its int32 gradient: no learning rate; the gradient is
renormalized so that its largest element has mu bits, with PstoShift.

    int8 weight:  w = clip(w - clip(PstoShift(G, bitlen(max|G|) - mu)))
    int32 bias:   b = b - PstoShift(G, bitlen(max|G|) - mu - BIAS_MU_OFFSET), saturated
"""

from __future__ import annotations

import numpy as np

from .rounding import as_i64, clip8, psto_shift, shift_for

BIAS_FRACTION_BITS = 8  # a bias's exponent sits this far below its layer's accumulator's
BIAS_MU_OFFSET = BIAS_FRACTION_BITS  # so a bias moves by up to 2^mu of the accumulator's LSB
INT32_MAX = 2**31 - 1


def niti_update(param, grad, mu: int) -> np.ndarray:
    if np.asarray(param).dtype == np.int8:
        return clip8(as_i64(param) - clip8(psto_shift(grad, shift_for(grad, mu))))
    new = as_i64(param) - psto_shift(grad, shift_for(grad, mu + BIAS_MU_OFFSET))
    return np.clip(new, -INT32_MAX, INT32_MAX)
