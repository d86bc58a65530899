"""The reference's reading of SparseUpdate(channels=...) in int8 (docs/int8.md, "Training part
of a layer's channels"), from the model and the SparseUpdate alone, not from the compile's
split (training/channel_split.py):

- a layer given a fraction f of its O output channels trains its first ceil(f O) rows of
  the weight (at least one); the step's forward and backward are the unsplit layer's;
- the update is NITI's update of the whole weight with the frozen rows' gradient taken as
  zero: the shift bitlen(max|G|) - mu is the trained rows', and with an exponent per channel
  each trained row's offset is from the whole weight's coarsest exponent; the frozen rows
  keep their values, and no exponent changes.
"""

from __future__ import annotations

import math

import numpy as np

from ..training.sparse_update import SparseUpdate


def trained_rows(model, rule) -> dict[str, int]:
    """{weight name: how many of its first rows train} of the layers `rule` trains by
    channels (a layer it also trains whole is not one)."""
    if not isinstance(rule, SparseUpdate):
        return {}
    params = {n: p.shape for n, p in model.named_parameters()}
    whole = set(rule.select(list(params)))
    return {f"{layer}.weight": max(1, math.ceil(fraction * params[f"{layer}.weight"][0]))
            for layer, fraction in rule.channels.items() if f"{layer}.weight" not in whole}


def update_rows(update, value: np.ndarray, grad: np.ndarray, rows: int) -> np.ndarray:
    """`update(value, grad)` (NITI's rule for the whole weight) with the gradient of the rows
    from `rows` on zero, and those rows as they were."""
    trained = np.zeros_like(grad)
    trained[:rows] = grad[:rows]
    new = update(value, trained)
    new[rows:] = value[rows:]
    return new
