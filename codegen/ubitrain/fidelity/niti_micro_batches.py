"""NITI's step over k micro-batches in numpy (niti/micro_batches.py), from the model and k
alone: the reference of an int8 compile with micro_batches=k.

It is NitiGraphReference run on each micro-batch in turn, with one set of rescale sites and
running statistics that every micro-batch moves, and the micro-batches' gradients added by
niti/micro_batches.py's rule from the first one on (the compile starts from an empty
accumulator instead). The loss is the mean of the micro-batches' losses; predict, too, runs
micro-batch by micro-batch.
"""

from __future__ import annotations

import numpy as np

from ..niti.micro_batches import accumulate
from .niti_reference import NitiGraphReference


class MicroBatchedReference(NitiGraphReference):
    """NitiGraphReference's `step` and `predict` over `k` micro-batches of the batch."""

    def __init__(self, model, example_input, k: int, *args, **kwargs):
        super().__init__(model, example_input[:len(example_input) // k], *args, **kwargs)
        self.k = k
        self.exponents: dict[str, int] = {}  # each gradient's, from the last backward

    def backward(self, node, values, err, ee) -> list:
        shares = super().backward(node, values, err, ee)
        for target, (_, e) in shares:
            if target.name in self.names:
                self.exponents[self.names[target.name]] = e
        return shares

    def step(self, x, labels, params):
        losses, sums = [], {}
        for part, part_labels in zip(np.split(x, self.k), np.split(labels, self.k)):
            loss, grads = super().step(part, part_labels, params)
            losses.append(loss)
            for name, g in grads.items():
                e = self.exponents[name]
                sums[name] = accumulate(*sums[name], g, e) if name in sums else (g, e)
        return float(np.mean(losses)), {name: total for name, (total, _) in sums.items()}

    def predict(self, x, params) -> np.ndarray:
        return np.concatenate([super(MicroBatchedReference, self).predict(part, params)
                               for part in np.split(x, self.k)])
