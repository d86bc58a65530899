"""The shift of one rescale site (an int32 accumulator turned into int8), with Mandheling's
self-adaptive rescaling.

NITI picks every shift from the bit length of the accumulator's maximum: a max-reduction over
the whole tensor, each step. Shifts change rarely, so an adaptive site reuses its previous
shift and recomputes it only when due:

* A site keeps (shift, interval, countdown, reductions, skips, exponent) in the step's int32
  state vector (the same layout in the C and in the reference).
* Due (countdown 0, or never computed): reduce, take the exact shift. The interval learned from
  the site's history doubles (up to `max_interval`) when the shift came out as before, and
  falls back to 1 when it changed. The countdown restarts at the interval.
* Not due: apply the previous shift. Saturation (a magnitude >= 2^(shift + bits), i.e. the
  exact shift would be larger) is seen in the same pass that shifts; it forces an immediate
  reduction with the interval reset to 1. Otherwise the countdown drops by one: a skip.
  A shift larger than needed (values shrank) costs precision until the next due reduction.

Exact sites (adaptive off) reduce every step; predict's reductions are not counted.
"""

from __future__ import annotations

import numpy as np

from .rounding import as_i64, shift_for

SHIFT, INTERVAL, COUNTDOWN, REDUCTIONS, SKIPS, EXPONENT = range(6)
SITE_FIELDS = 6
EXACT, EXACT_COUNTED, ADAPTIVE = 0, 1, 2  # predict / training without / with adaptive rescaling


def site_shift(acc, site: np.ndarray, bits: int, mode: int, max_interval: int) -> int:
    """The shift for `acc` at a site whose state row is `site` (updated in place)."""
    if mode == EXACT:
        return shift_for(acc, bits)
    if mode == ADAPTIVE and site[INTERVAL] > 0 and site[COUNTDOWN] > 0:
        s = int(site[SHIFT])
        a = as_i64(acc)
        if a.size == 0 or np.abs(a).max() < (1 << (s + bits)):
            site[COUNTDOWN] -= 1
            site[SKIPS] += 1
            return s
        interval = 1  # saturated: the exact shift is larger
        s = shift_for(acc, bits)
    else:
        s = shift_for(acc, bits)
        same = site[INTERVAL] > 0 and s == site[SHIFT]
        interval = min(2 * int(site[INTERVAL]), max_interval) if same else 1
    site[REDUCTIONS] += 1
    site[SHIFT] = s
    site[INTERVAL] = interval
    site[COUNTDOWN] = interval
    return s
