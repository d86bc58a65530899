"""The C runtime's random masks, drawn in numpy: what `ub_dropout_mask` (runtime_c/ub_runtime.c)
draws from the same state, bit for bit, so that a PyTorch reference can apply ubitrain's masks.

Each step draws every mask at its start, in graph order, one SplitMix64 number per element;
an element is 0 when the top 24 bits, as a float in [0, 1), are below p, else the mask's
scale. Dropout's masks are (p, 1/(1-p)); a `bernoulli_(keep)` (in-place Dropout,
StochasticDepth: frontend/aten/dropout.py) is (1 - keep, 1).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(state: int, n: int) -> tuple[np.ndarray, int]:
    """`n` draws of ub_rng_next from `state`; returns (the draws as uint64, the new state)."""
    with np.errstate(over="ignore"):
        z = np.uint64(state) + _GOLDEN * np.arange(1, n + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        new_state = int((np.uint64(state) + _GOLDEN * np.uint64(n)))
    return z ^ (z >> np.uint64(31)), new_state


def dropout_mask(state: int, shape, p: float, scale: float | None = None
                 ) -> tuple[np.ndarray, int]:
    """One mask (0 or `scale`, by default Dropout's 1/(1-p), in float32 as the C has them)
    and the state after it."""
    draws, state = splitmix64(state, int(np.prod(shape)))
    u = (draws >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    p32 = np.float32(p)
    if scale is None:  # as the frontend computes it: from p in float32, in double
        scale = 1.0 / (1.0 - float(p32)) if p32 < 1 else 0.0
    return np.where(u < p32, np.float32(0.0), np.float32(scale)).reshape(shape), state


def bernoulli_mask(state: int, shape, keep: float) -> tuple[np.ndarray, int]:
    """`torch.empty(shape).bernoulli_(keep)` as the C draws it: 1 with probability `keep`."""
    return dropout_mask(state, shape, 1.0 - keep, 1.0)


def dropout_masks(seed: int, shapes, p: float) -> list[np.ndarray]:
    """The masks `ub_dropout_mask` draws at the start of the first step, in graph order."""
    masks, state = [], seed
    for shape in shapes:
        mask, state = dropout_mask(state, shape, p)
        masks.append(mask)
    return masks
