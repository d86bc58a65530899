"""A compiled int8 model: the package of the float path, with what the int8 trainer and a
DSP split need (a split step starts its trainer from offload/trainer.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..package import Package


@dataclass
class Int8Package(Package):
    """A compiled int8 (NITI) model; `build()` returns an Int8Trainer
    (runtime/int8_trainer.py). A module-level class, so that a package pickles (the fleet
    sends it to its worker processes)."""

    config: object = None  # ub.NITI
    integer_parameters: list[str] = field(default_factory=list)  # each with <name>.exponent
    precision: str = "int8"
    # with NITI(dsp_offload=True): the DSP split (offload/)
    placement: list | None = field(default=None, repr=False)  # hexagon-v66: DSP / CPU
    segments: list | None = field(default=None, repr=False)  # dsp_offload: DSP methods
    overlaps: list | None = field(default=None, repr=False)  # CPU kernels during each

    def build(self, seed: int = 0, **kwargs):
        from ..runtime.int8_trainer import Int8Trainer
        if self.segments is not None:
            from ..offload.trainer import start_split_trainer
            return Int8Trainer(start_split_trainer(self, seed), self)
        return Int8Trainer(super().build(seed=seed, **kwargs), self)
