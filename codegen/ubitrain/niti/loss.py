"""NITI's integer softmax cross-entropy gradient, and the float loss reported beside it.

From int8 logits z with exponent e (value z * 2^e), per row:
1. t = z * 47274: base-2 exponents in fixed point (47274 / 2^15 = log2(e) to 5 digits), so the
   exponent of exp(z_i) is t_i * 2^(e - 15).
2. The row maximum goes to 10: s_i = 10 - floor((t_max - t_i) * 2^(e - 15)), and
   P_i = 2^s_i - 1 (0 where s_i <= 0). The row maximum thus weighs 1023.
3. P[target] -= sum(P); G = trunc(P * 2^11 / sum(P)): softmax minus the one-hot label in
   Q11, with division truncating toward zero (C99's `/`; matters for the negative target).
4. The error is PstoShift(G, 4), clipped to [-127, 127]: int8 in Q7. NITI uses StoShift
   (a random integer in [0, 2^4)); the pseudo-stochastic rounding needs no generator, so the
   step stays a pure function of its inputs on every target.
The error's scale is irrelevant downstream: every weight gradient is renormalised to 2^mu
(update.py), so the mean over the batch is left out as NITI does.
"""

from __future__ import annotations

import numpy as np

from .rounding import as_i64, clip8, psto_shift, trunc_div

LOG2E_Q15 = 47274
TOP_EXPONENT = 10
GRAD_FRACTION_BITS = 11
ERROR_SHIFT = 4
MAX_CLASSES = 512  # the softmax gradient's P * 2^11 stays within int32


def softmax_xent_grad(z8, exponent: int, labels) -> np.ndarray:
    """int8 error of the logits [B, C] (Q7) for integer class labels [B]."""
    t = as_i64(z8) * LOG2E_Q15
    d = t.max(axis=1, keepdims=True) - t  # >= 0
    k = 15 - exponent
    if k >= 0:
        q = d >> k
    else:  # any nonzero distance shifted left by >= 4 is past the range that matters
        q = np.where(d == 0, 0, np.minimum(d << min(-k, 4), TOP_EXPONENT + 1))
    s = TOP_EXPONENT - np.minimum(q, TOP_EXPONENT + 1)
    p = np.where(s > 0, (np.int64(1) << np.maximum(s, 0)) - 1, 0)
    total = p.sum(axis=1, keepdims=True)
    rows = np.arange(p.shape[0])
    p[rows, as_i64(labels)] -= total[:, 0]
    g = trunc_div(p << GRAD_FRACTION_BITS, total)
    return clip8(psto_shift(g, ERROR_SHIFT)).astype(np.int8)


def cross_entropy(z8, exponent: int, labels) -> float:
    """The mean cross-entropy of the dequantized logits (reported, not trained on)."""
    z = as_i64(z8).astype(np.float64) * 2.0 ** exponent
    z = z - z.max(axis=1, keepdims=True)
    logsum = np.log(np.exp(z).sum(axis=1))
    return float(np.mean(logsum - z[np.arange(z.shape[0]), as_i64(labels)]))
