"""Float32 <-> int8 with one power-of-two exponent per tensor, from the bits of the floats.

A float32 x is M * 2^b with the integer mantissa M (the 23 stored bits, plus the implicit
leading one for normal numbers) and b = max(E, 1) - 150 for the stored exponent field E. With
the tensor's largest magnitude written the same way, max|x| < 2^(bitlen(M) + b); the exponent
of the int8 tensor is e = bitlen(M_max) + b_max - 7, the float analogue of NITI's integer rule
(rounding.py), and each element is RoundShift(M, e - b), clipped to [-127, 127]. Everything is
integer arithmetic, so the generated C (quantize.c.j2) gives the same bits with or without an
FPU, and whatever a target does with subnormals. An all-zero tensor gets exponent 0.

Dequantization q * 2^e is exact in float32 for the exponents training produces.
"""

from __future__ import annotations

import numpy as np

from ..errors import CompileError
from .rounding import as_i64, bitlen, clip8


def _mantissa_exponent(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.int64)
    field = (bits >> 23) & 0xFF
    if np.any(field == 0xFF):
        raise ValueError("cannot quantize a non-finite float (inf or NaN)")
    mantissa = (bits & 0x7FFFFF) | np.where(field > 0, 1 << 23, 0)
    sign = np.where(bits >> 31, -1, 1)
    return sign * mantissa, np.maximum(field, 1) - 150


def quantize(x) -> tuple[np.ndarray, int]:
    """(int8 values, exponent) with x ~ q * 2^e; see the module docstring."""
    x = np.asarray(x, np.float32)
    mant, base = _mantissa_exponent(x)
    if x.size == 0 or not np.any(mant):
        return np.zeros(x.shape, np.int8), 0
    top = int(np.argmax(np.abs(x).reshape(-1)))
    e = int(bitlen(mant.reshape(-1)[top]) + base.reshape(-1)[top]) - 7
    shift = np.minimum(e - base, 40)  # beyond 40 bits every mantissa rounds to zero
    mag = np.abs(mant)
    half = np.int64(1) << np.maximum(shift - 1, 0)
    up = np.where(shift > 0, (mag + half) >> np.maximum(shift, 0), mag << np.maximum(-shift, 0))
    q = np.sign(mant) * up
    return clip8(q).astype(np.int8), e


def dequantize(q, e: int) -> np.ndarray:
    return np.ldexp(as_i64(q).astype(np.float32), e).astype(np.float32)


def quantize_weight(name: str, value: np.ndarray, per_channel: bool = False):
    """(int8, exponent) of a parameter; with `per_channel`, one exponent per output channel
    (channel_exponents.py)."""
    try:
        if per_channel:
            from .channel_exponents import quantize_channels
            return quantize_channels(value)
        return quantize(value)
    except ValueError:
        raise CompileError(f"parameter {name} holds inf or NaN; int8 training needs finite "
                           "initial weights") from None
