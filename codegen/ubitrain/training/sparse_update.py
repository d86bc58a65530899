"""Sparse update (On-Device Training Under 256KB Memory, tiny-training): train only part of
a model, so that the backward pass keeps no activation and computes no gradient that no
update needs.

`SparseUpdate(biases=True, last_layers=2)` trains every bias plus all parameters of the last
two layers; the rest is frozen. A layer is a module that owns parameters, in the model's
parameter order (the order of `named_parameters()`, which is its definition order). Relax's
Gradient pass is asked only for the selected parameters, so the backward pass of everything
else is pruned: weight gradients that nobody updates are never computed, and activations
that only those gradients needed are not kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError


@dataclass(frozen=True)
class SparseUpdate:
    biases: bool = False
    last_layers: int = 0

    def __post_init__(self):
        if self.last_layers < 0:
            raise CompileError(f"SparseUpdate(last_layers={self.last_layers}) must be >= 0")
        if not self.biases and self.last_layers == 0:
            raise CompileError("SparseUpdate selects nothing: set biases=True and/or "
                               "last_layers=k (k >= 1)")

    def select(self, params: list[str]) -> list[str]:
        """The trainable parameter names, in model order."""
        layers = list(dict.fromkeys(_layer(p) for p in params))
        if self.last_layers > len(layers):
            raise CompileError(f"SparseUpdate(last_layers={self.last_layers}) asks for more "
                               f"layers than the model has ({len(layers)}: {layers})")
        last = set(layers[len(layers) - self.last_layers:]) if self.last_layers else set()
        return [p for p in params
                if (self.biases and p.endswith(".bias")) or _layer(p) in last]


def _layer(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else ""
