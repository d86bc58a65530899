"""The int8 layer program: the model's forward pass as a chain of NITI layers.

Convolutions and linear layers are one kind (`Conv`; a linear layer is a 1x1 convolution over
[B, F, 1, 1]); ReLU, max-pooling (windows that tile the input) and flatten need no
arithmetic beyond int8. Every tensor is int8 with one exponent.

The step's int32 state vector (the same layout in the C and the reference):
  [0] completed training steps   [1] exponent of the quantized input
  then SITE_FIELDS values per rescale site (rescale.py): each Conv has a forward site (its
  output), a gradient site (its weight gradient, renormalised to 2^mu) unless it is frozen,
  and, unless no trained weight lies before it, an error site (the error it passes to its
  input).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..niti.rescale import SITE_FIELDS

STEP_INDEX, INPUT_EXPONENT_INDEX, HEADER = 0, 1, 2


@dataclass
class Conv:
    weight: str  # state_dict name
    in_shape: tuple[int, int, int, int]  # [B, C, H, W]
    out_shape: tuple[int, int, int, int]  # [B, O, OH, OW]
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    linear: bool = False
    where: str = ""
    trainable: bool = True  # False: frozen (trainable=), no weight gradient or update
    fwd_site: int = -1
    grad_site: int = -1  # -1: frozen
    error_site: int = -1  # -1: the input needs no error

    @property
    def weight_shape(self) -> tuple[int, ...]:
        o, c = self.out_shape[1], self.in_shape[1]
        return (o, c) if self.linear else (o, c, *self.kernel)

    @property
    def reduction(self) -> int:
        """Products summed into one accumulator, in the largest of the three convolutions."""
        b, o, oh, ow = self.out_shape
        c = self.in_shape[1]
        kh, kw = self.kernel
        return max(c * kh * kw, b * oh * ow, o * kh * kw)


@dataclass
class Elementwise:
    """A float function as compile-time tables (fallback.py): F, D [rows, 256] int8."""

    op: str
    shape: tuple[int, ...]
    f: object = None
    f_exp: object = None
    d: object = None
    d_exp: object = None
    where: str = ""
    fwd_site: int = -1
    error_site: int = -1


@dataclass
class ReLU:
    shape: tuple[int, ...]
    where: str = ""


@dataclass
class MaxPool:
    in_shape: tuple[int, int, int, int]
    out_shape: tuple[int, int, int, int]
    kernel: tuple[int, int]  # stride == kernel, no padding
    where: str = ""


@dataclass
class Flatten:
    in_shape: tuple[int, ...]
    out_shape: tuple[int, int]
    where: str = ""


@dataclass
class LayerProgram:
    input_name: str
    input_shape: tuple[int, ...]
    layers: list = field(default_factory=list)
    weights: dict = field(default_factory=dict)  # name -> (int8 values, exponent)
    sites: int = 0

    @property
    def classes(self) -> int:
        return self.output_shape[-1]

    @property
    def output_shape(self) -> tuple[int, ...]:
        last = self.layers[-1]
        if isinstance(last, Conv) and last.linear:
            return last.out_shape[:2]
        return tuple(getattr(last, "out_shape", None) or getattr(last, "shape", ()))

    @property
    def state_size(self) -> int:
        return HEADER + SITE_FIELDS * self.sites

    def convs(self) -> list[Conv]:
        return [layer for layer in self.layers if isinstance(layer, Conv)]

    def first_trained(self) -> int:
        """Index of the first trained Conv: the backward pass stops there."""
        return next(i for i, layer in enumerate(self.layers)
                    if isinstance(layer, Conv) and layer.trainable)

    def number_sites(self) -> None:
        """Give every layer its rescale sites (forward order): an error site only where a
        trained weight lies before it, a gradient site only to a trained Conv."""
        n, seen_trained = 0, False
        for layer in self.layers:
            if isinstance(layer, (Conv, Elementwise)):
                layer.fwd_site, layer.error_site = n, -1
                n += 1
            if isinstance(layer, Conv):
                layer.grad_site = -1
            if isinstance(layer, Conv) and layer.trainable:
                layer.grad_site = n
                n += 1
            if isinstance(layer, (Conv, Elementwise)) and seen_trained:
                layer.error_site = n
                n += 1
            seen_trained = seen_trained or isinstance(layer, Conv) and layer.trainable
        self.sites = n


def site_offset(site: int) -> int:
    return HEADER + SITE_FIELDS * site


def elements(shape) -> int:
    return math.prod(shape)
