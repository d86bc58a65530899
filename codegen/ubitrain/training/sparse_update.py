"""Sparse update (On-Device Training Under 256KB Memory, tiny-training): train only part of
a model, so that the backward pass keeps no activation and computes no gradient that no
update needs.

`SparseUpdate(biases=True, last_layers=2)` trains every bias plus all parameters of the last
two layers; the rest is frozen. `SparseUpdate(channels={"fc1": 0.25})` trains the first
quarter of layer fc1's output channels (rows of its weight; training/channel_split.py). A
layer is a module that owns parameters, in the model's parameter order (the order of
`named_parameters()`, which is its definition order). Relax's
Gradient pass is asked only for the selected parameters, so the backward pass of everything
else is pruned: weight gradients that nobody updates are never computed, and activations
that only those gradients needed are not kept.

With precision="int8" the same selection holds; a layer trained by channels keeps one
quantization for its trained and frozen rows and computes the unsplit layer's step, only
its first rows taking NITI's update (docs/int8.md, "Training part of a layer's channels").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CompileError


@dataclass(frozen=True)
class SparseUpdate:
    biases: bool = False
    last_layers: int = 0
    channels: dict[str, float] = field(default_factory=dict)  # layer -> fraction of outputs

    def __post_init__(self):
        if self.last_layers < 0:
            raise CompileError(f"SparseUpdate(last_layers={self.last_layers}) must be >= 0")
        if not isinstance(self.channels, dict):
            raise CompileError("SparseUpdate(channels=...) takes a dict {layer name: fraction "
                               "of its output channels}, e.g. {'fc1': 0.25}")
        if not self.biases and self.last_layers == 0 and not self.channels:
            raise CompileError("SparseUpdate selects nothing: set biases=True, last_layers=k "
                               "(k >= 1) and/or channels={layer: fraction}")

    def select(self, params: list[str]) -> list[str]:
        """The trainable parameter names, in model order."""
        layers = list(dict.fromkeys(_layer(p) for p in params))
        if self.last_layers > len(layers):
            raise CompileError(f"SparseUpdate(last_layers={self.last_layers}) asks for more "
                               f"layers than the model has ({len(layers)}: {layers})")
        last = set(layers[len(layers) - self.last_layers:]) if self.last_layers else set()
        return [p for p in params
                if (self.biases and p.endswith(".bias")) or _layer(p) in last]

    def channel_fractions(self, selected: list[str]) -> dict[str, float]:
        """The layers whose weight trains in part: those not already trained whole."""
        return {layer: f for layer, f in self.channels.items()
                if f"{layer}.weight" not in selected}


def _layer(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else ""
