"""One exponent per output channel of an int8 weight (a conv's [C_out, ...], a linear's
[out, in]): the spec, before the compile uses it (docs/int8.md, the 256 KB line).

Folding BatchNorm into a conv multiplies each output channel by gamma / sigma, so a trained
net's channels can differ by 2^8 in scale, and one exponent per tensor leaves the small
channels a few int8 levels or none. Each channel c gets its own exponent e[c] (quantize's rule
on the channel alone); the rest of the step keeps one exponent per tensor:

- forward: channel c of the int32 accumulator, at e_x + e[c], is RoundShift'ed by E - e[c]
  (E = max e, the coarsest), so the tensor has the one exponent e_x + E again. A folded
  BatchNorm balances the channels' outputs, so this loses little: the accumulator keeps
  bitlen(acc) - 7 more bits than the int8 output will;
- backward (the input's error): through the weight at the one exponent E, each channel
  RoundShift'ed by E - e[c]: a small channel's share of dx is small in value;
- update: NITI's update of the tensor, the same value for every channel. The int32
  gradient's shift s = bitlen(max |G|) - mu is the tensor's; channel c, whose LSB is
  2^(E - e[c]) times finer, moves by PstoShift(G[c], s - (E - e[c])) of its own LSBs (a left
  shift where that is negative), clipped as before. With every e[c] equal this is NITI's
  per-tensor rule (update.py) bit for bit.
"""

from __future__ import annotations

import numpy as np

from .quantize import quantize
from .rounding import as_i64, clip8, psto_shift, round_shift, shift_for


def quantize_channels(w) -> tuple[np.ndarray, np.ndarray]:
    """(int8 values, int32 exponent per channel of axis 0). An all-zero channel takes the
    coarsest exponent of the others (0 when every channel is zero): it must not set E."""
    w = np.asarray(w, np.float32)
    parts = [quantize(channel) for channel in w]
    nonzero = [e for (q, e) in parts if np.any(q)]
    coarsest = max(nonzero) if nonzero else 0
    q = np.stack([q for q, _ in parts]) if parts else np.zeros(w.shape, np.int8)
    e = np.array([e if np.any(p) else coarsest for p, e in parts], np.int32)
    return q.astype(np.int8), e


def _per_channel(x, shifts, axis: int, shift) -> np.ndarray:
    x = as_i64(x)
    out = np.empty_like(x)
    for c, s in enumerate(shifts):
        index = [slice(None)] * x.ndim
        index[axis] = c
        out[tuple(index)] = shift(x[tuple(index)], int(s))
    return out


def to_coarsest(total, e, axis: int = 1) -> tuple[np.ndarray, int]:
    """An accumulator whose channels (along `axis`) sit at exponents offset by e[c], as
    (int64 values, E): each channel RoundShift'ed to E = max e."""
    coarsest = int(np.max(e))
    return _per_channel(total, coarsest - as_i64(e), axis, round_shift), coarsest


def weight_at_coarsest(q, e) -> tuple[np.ndarray, int]:
    """The weight at one exponent for the backward: (int8 values, E)."""
    values, coarsest = to_coarsest(q, e, axis=0)
    return clip8(values).astype(np.int8), coarsest


def update(q, grad, e, mu: int) -> np.ndarray:
    """NITI's update of an int8 weight with per-channel exponents (the module's docstring)."""
    s = shift_for(grad, mu)
    steps = _per_channel(grad, s - (int(np.max(e)) - as_i64(e)), 0, psto_shift)
    return clip8(as_i64(q) - clip8(steps)).astype(np.int8)


def by_channel(exponent, ndim: int) -> np.ndarray:
    """An exponent [1] or [C] shaped to scale a parameter of `ndim` axes (channels first)."""
    e = np.asarray(exponent, np.int64)
    return e.reshape(-1, *[1] * (ndim - 1)) if e.size > 1 else e.reshape(()) + 0
