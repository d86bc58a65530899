"""NITI's integer arithmetic in numpy: bit lengths, shifts and the two rounding rules.

Every function takes integer arrays (any width; int64 inside) and is written on magnitudes,
so that the rules are symmetric about zero as the paper states them:

* Division by 2^s truncates toward zero. The original ran on PyTorch 1.6/1.7, whose integer
  `//` truncated; numpy's `//` floors, which biases negative values by one LSB.
* RoundShift(x, s) rounds half away from zero: |x| + 2^(s-1), shifted, sign restored.
* PstoShift(x, s) (pseudo-stochastic, no random generator): of the s discarded bits the high
  ceil(s/2) bits are the "probability" and the low floor(s/2) bits the "random number" (doubled
  when s is odd, so both span the same range); the result rounds away from zero when the
  probability is greater, else truncates.
* A shift s <= 0 is a left shift by -s (exact).

Edge case at 128: the shift that brings an int32 maximum m into int8 is
`max(0, bitlen(m) - 7)`, the exact bit length (floor(log2 m) + 1), not ceil(log2 m). A maximum
of exactly 128 has bit length 8 and shifts by one (to 64); ceil(log2 128) = 7 would keep it at
128 and need a clip to 127. With the bit length nothing needs clipping except a value that
RoundShift rounds up to 128 (e.g. 255 >> 1 rounds to 128): results are clipped to [-127, 127].
"""

from __future__ import annotations

import numpy as np

INT8_MAX = 127


def as_i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def bitlen(x) -> np.ndarray:
    """Bits needed for |x| (0 for 0): floor(log2 |x|) + 1, exactly, elementwise."""
    m = np.abs(as_i64(x))
    out = np.zeros(m.shape, np.int64)
    for b in range(63):
        out += (m >> b) > 0
    return out


def max_bitlen(x) -> int:
    """Bit length of max |x|: the reduction that picks a tensor's shift."""
    a = as_i64(x)
    return int(bitlen(np.abs(a).max())) if a.size else 0


def shift_for(x, bits: int = 7) -> int:
    """The right shift that brings max |x| below 2^bits (NITI: bitlen(max) - 7, never < 0)."""
    return max(0, max_bitlen(x) - bits)


def clip8(x) -> np.ndarray:
    return np.clip(as_i64(x), -INT8_MAX, INT8_MAX)


def trunc_shift(x, s: int) -> np.ndarray:
    """x / 2^s truncated toward zero (s <= 0: x * 2^-s)."""
    a = as_i64(x)
    if s <= 0:
        return a << -s
    return np.sign(a) * (np.abs(a) >> s)


def trunc_div(a, b) -> np.ndarray:
    """a / b truncated toward zero, as C99's integer division (b > 0)."""
    a, b = as_i64(a), as_i64(b)
    return np.sign(a) * (np.abs(a) // b)


def round_shift(x, s: int) -> np.ndarray:
    """RoundShift: x / 2^s rounded half away from zero (not clipped)."""
    a = as_i64(x)
    if s <= 0:
        return a << -s
    return np.sign(a) * ((np.abs(a) + (1 << (s - 1))) >> s)


def psto_shift(x, s: int) -> np.ndarray:
    """PstoShift: x / 2^s with NITI's pseudo-stochastic rounding (not clipped)."""
    a = as_i64(x)
    if s <= 0:
        return a << -s
    m = np.abs(a)
    q = m >> s
    rest = m & ((1 << s) - 1)
    low_bits = s // 2
    probability = rest >> low_bits
    noise = rest & ((1 << low_bits) - 1)
    if s % 2:
        noise = noise << 1
    return np.sign(a) * (q + (probability > noise))


def rescale_to_int8(acc, bits: int = 7) -> tuple[np.ndarray, int]:
    """An int32 accumulator to int8 with RoundShift: (values, shift)."""
    s = shift_for(acc, bits)
    return clip8(round_shift(acc, s)), s


LOWEST_BOUND_EXPONENT = -16  # 2^16 times any bound an activation clips at is beyond int8


def int8_bound(value: int, exponent: int) -> int:
    """The int8 code at `exponent` of an activation's clipping bound `value` (ReLU6's 6):
    RoundShift(value, exponent), clipped to 127."""
    return int(clip8(round_shift(value, max(exponent, LOWEST_BOUND_EXPONENT))))
