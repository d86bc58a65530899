"""NITI's step over k micro-batches (precision="int8" with micro_batches=k): the spec.

Each micro-batch of B/k samples is a NITI step of its own up to the gradients: its input is
quantized, and every activation and error narrowed, at exponents from the maximum over that
micro-batch; its rescale sites (and an integer BatchNorm's batch statistics and running
statistics) move once per micro-batch, in order. So micro-batch i gives each trained
parameter an int32 gradient G_i at an exponent e_i of its own.

The k gradients are added at the coarsest exponent seen so far, in micro-batch order:

    A_1, E_1 = G_1, e_1
    E_i = max(E_{i-1}, e_i)
    A_i = RoundShift(A_{i-1}, E_i - E_{i-1}) + RoundShift(G_i, E_i - e_i)

RoundShift (half away from zero) is the rule NITI narrows and aligns with everywhere else.
Only right shifts occur, and |RoundShift(x, s)| <= |x|, so |A_k| <= |G_1| + ... + |G_k|: no
more than the full batch's own int32 sum of the same number of int8 x int8 products could
reach. A_k stays int32 wherever the full-batch step's gradients do; no wider accumulator is
needed. The fold rounds a finer micro-batch's bits away (and rounds the running sum again
when a later micro-batch is coarser), but only bits at least E_k - e_i below the coarsest
micro-batch's last place, far below the mu bits (mu <= 7) NITI's update keeps of the
largest element.

The update then sees A_k as it sees a full batch's gradient: it moves by PstoShift(A_k,
bitlen(max |A_k|) - mu), which does not read the exponent E_k (a weight's exponent stays
fixed). It differs from the full batch's step by the micro-batches' own exponents (the
input's, a maximum over part of the batch, is as fine as the batch's or finer), the
alignment's rounding, the sites' k moves per step (an adaptive site counts its interval in
micro-batches) and integer BatchNorm's statistics. predict, which runs micro-batch by
micro-batch too, quantizes each micro-batch's rows on their own.

The compile keeps (A, E) in an int32 accumulator and an int32 exponent that starts at EMPTY,
below any exponent, so that the first micro-batch takes the rule's first line: RoundShift of
an int32 by 33 bits or more is 0 (|x| + 2^(s-1) < 2^s), and shifts are held to SHIFT_LIMIT,
which changes no value.
"""

from __future__ import annotations

import numpy as np

from .rounding import round_shift

EMPTY = -(2**30)  # the exponent of an accumulator before the first micro-batch
SHIFT_LIMIT = 40  # a RoundShift of an int32 by 33 or more is 0 already


def accumulate(acc, e_acc: int, grad, e_grad: int) -> tuple[np.ndarray, int]:
    """One micro-batch's gradient `grad` at `e_grad` added to the running sum `acc` at
    `e_acc`: (int64 sum, its exponent), both RoundShift'ed to the coarser exponent."""
    e = max(e_acc, e_grad)
    return (round_shift(acc, min(e - e_acc, SHIFT_LIMIT))
            + round_shift(grad, min(e - e_grad, SHIFT_LIMIT)), e)
