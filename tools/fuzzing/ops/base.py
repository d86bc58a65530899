"""What an op of the fuzzer's table is, where the concept modules define theirs, and the
window arithmetic that convolutions and pools share.

A shape is a tuple with the batch first. `infer` returns the output shape, or None where
PyTorch would refuse the op (a kernel larger than its padded input, a BatchNorm over one
value per channel); `layer` returns the constructor of the op's module, or of a constant
tensor attribute (None: a functional op, or no attribute for these attributes); `call` the
forward expression over its inputs' names; `sample` draws attributes for given input shapes
(None: this op does not fit them).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

Shape = tuple


@dataclass(frozen=True)
class Op:
    arity: int  # tensor inputs; 0 < arity
    sample: Callable[[random.Random, list[Shape]], dict | None]
    infer: Callable[[list[Shape], dict], Shape | None]
    call: Callable[[list[str], dict, str], str]
    layer: Callable[[list[Shape], dict], str | None] | None = None  # None: no attribute


# Every op the concept modules define, by name. Not the table: ops/__init__.py orders them.
DEFINED: dict[str, Op] = {}


def define(name: str, spec: Op) -> None:
    if name in DEFINED:
        raise ValueError(f"fuzzer op {name!r} is defined twice")
    DEFINED[name] = spec


def op(name, arity=1, layer=None):
    """Define `name` from a function returning its (sample, infer, call)."""
    def register(fns):
        sample, infer, call = fns()
        define(name, Op(arity, sample, infer, call, layer))
        return fns
    return register


def window_count(size, k, s, p, d=1, ceil=False):
    """Windows of a convolution or pool along one axis (None: the kernel does not fit)."""
    eff = (k - 1) * d + 1
    span = size + 2 * p - eff
    if span < 0:
        return None
    n = (-(-span // s) if ceil else span // s) + 1
    if ceil and (n - 1) * s >= size + p:  # PyTorch drops a last window that starts in padding
        n -= 1
    return n


def broadcast(a: Shape, b: Shape) -> Shape | None:
    """Two shapes of one rank broadcast together, the batch axis kept (None: they do not)."""
    if len(a) != len(b):
        return None
    out = []
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out) if out[0] == max(a[0], b[0]) else None
