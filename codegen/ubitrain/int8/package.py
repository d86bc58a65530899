"""A compiled int8 model: the package of the float path, with what the int8 trainer and the
DSP split need."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..package import Package
from .layers import LayerProgram
from .trainer import Int8Trainer
from .update import NITI


@dataclass
class Int8Package(Package):
    """A compiled int8 model; `build()` returns an Int8Trainer. A module-level class, so that
    a package pickles (the fleet sends it to its worker processes)."""

    layer_program: LayerProgram | None = field(default=None, repr=False)
    placement: list | None = field(default=None, repr=False)  # hexagon-v66: DSP / CPU
    segments: list | None = field(default=None, repr=False)  # dsp_offload: DSP methods
    overlaps: list | None = field(default=None, repr=False)  # CPU kernels during each
    config: NITI | None = None
    precision: str = "int8"

    def build(self, seed: int = 0, **kwargs) -> Int8Trainer:
        if self.segments is not None:
            from .offload_trainer import start_split_trainer
            return Int8Trainer(start_split_trainer(self, seed), self)
        return Int8Trainer(super().build(seed=seed, **kwargs), self)
