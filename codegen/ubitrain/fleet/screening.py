"""What the server lets into a merge: a client's update is refused when it is not finite, when
its size is far beyond the others', or (int8) when it changes the weights' exponents.

A client sends its weights after the round; its update is the difference from the global
model it was sent, and the update's size its L2 norm over every float tensor (int8: over
value x 2^exponent). Clients that trained the same number of steps from the same model move
it by comparable amounts (benchmarks/fleet_robust.py, the digits over 20 clients, 8 rounds:
the largest update's norm over the median of the others' reached 1.78 with IID shards, 2.18
and 2.57 with Dirichlet(0.5) and (0.1) labels), so an update more than `NORM_FACTOR` times
the median of the others' is not training: it is refused, not averaged in, and the round
merges the rest. Measured against clipping such updates to that size, Flower's
FedTrimmedAvg and FedMedian, refusing was the only merge that kept both the clean run's
accuracy and the poisoned runs' at FedAvg's (README, "A fleet"). A NaN or an inf
anywhere refuses the update whatever its norm. An int8 client never changes an exponent
(NITI moves int8 values only, int8_exchange.py): a reply whose exponents differ from the
global model's is refused too; its values, int8, are bounded by construction.

`screen="norm"` (the default) does all of this; `screen="finite"` refuses only non-finite
updates (and int8 exponent changes), for a strategy that is robust on its own (Flower's
FedTrimmedAvg or FedMedian); `screen=None` lets everything in.
"""

from __future__ import annotations

import numpy as np

from ..errors import UbitrainError
from ..niti.channel_exponents import by_channel

SCREENS = ("norm", "finite", None)
NORM_FACTOR = 10.0


def _delta_norm(update: dict, sent: dict) -> float:
    """||update - sent|| over the float tensors (int8 weights as value x 2^exponent)."""
    total = 0.0
    for name, value in update.items():
        value, base = np.asarray(value), np.asarray(sent[name])
        if value.dtype.kind == "f":
            total += float(np.sum((value.astype(np.float64) - base) ** 2))
        elif value.dtype == np.int8 and name + ".exponent" in update:
            scale = np.exp2(by_channel(update[name + ".exponent"], value.ndim).astype(np.float64))
            total += float(np.sum(((value.astype(np.float64) - base) * scale) ** 2))
    return float(np.sqrt(total))


def refusal(update: dict, sent: dict) -> str | None:
    """Why `update` cannot be merged whatever the others sent, or None."""
    missing = sorted(set(sent) - set(update) - {"niti.step"})
    if missing:
        return f"it lacks {', '.join(missing[:3])}"
    for name, value in update.items():
        value = np.asarray(value)
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            return f"{name} holds NaN or inf"
        if name.endswith(".exponent") and not np.array_equal(value, sent[name]):
            return f"it changes {name} (int8 training never changes an exponent)"
    return None


def screened(updates: list[dict], sent: dict, screen: str | None) -> list[str | None]:
    """For each update, why it is refused (None: it is merged)."""
    if screen not in SCREENS:
        raise UbitrainError(f"screen={screen!r}: choose one of {SCREENS}")
    if screen is None:
        return [None] * len(updates)
    reasons = [refusal(u, sent) for u in updates]
    if screen == "norm":
        finite = [i for i, r in enumerate(reasons) if r is None]
        norms = {i: _delta_norm(updates[i], sent) for i in finite}
        for i in finite:
            others = [norms[j] for j in finite if j != i]
            if not others:
                continue
            reference = float(np.median(others))
            if norms[i] > NORM_FACTOR * reference:
                reasons[i] = (f"its update's norm {norms[i]:.3g} is over {NORM_FACTOR:g}x the "
                              f"others' median {reference:.3g}")
    return reasons


def norm_ratios(updates: list[dict], sent: dict) -> list[float]:
    """Each update's norm over the median of the others' (the measurement behind
    NORM_FACTOR)."""
    norms = [_delta_norm(u, sent) for u in updates]
    return [n / float(np.median(norms[:i] + norms[i + 1:])) for i, n in enumerate(norms)
            if len(norms) > 1]
