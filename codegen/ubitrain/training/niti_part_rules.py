"""The NITI rewrite's rules for a weight split by output channels (SparseUpdate(channels=...),
training/channel_split.py): the split layer computes what the unsplit one would, bit for bit.

The float graph computes such a layer as one product per part of its weight: concatenated in
the forward, added in the backward (the input error, one term per part). Both parts hold
rows of one int8 weight at the weight's one exponent (per tensor, or per channel with the
whole weight's coarsest), so their int32 products are the unsplit product's channels, or
its terms, at the same exponent: they join as int32 sums, exactly, and are narrowed once,
where the unsplit layer's sum would be. A part's product is a `PartProduct` until its other
part's joins it; nothing else reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tvm.relax import op as R

from ..errors import UnsupportedOpError
from .niti_values import Accumulator, Parameter, PartProduct, PendingSum

if TYPE_CHECKING:
    from .niti_graph import Rewriter


def product(weight, acc: Accumulator):
    """A product by `weight`: a `PartProduct` where it is a part of a split weight."""
    if isinstance(weight, Parameter) and weight.part is not None:
        return PartProduct(acc, weight.part)
    return acc


def is_part(value) -> bool:
    return isinstance(value, (PartProduct, PendingSum))


def concat_parts(rw: Rewriter, fields: list, axis: int, name: str) -> Accumulator:
    """The forward: the parts' products side by side, in the order of their rows, are the
    unsplit layer's accumulator (each at the same exponent, the first's taken)."""
    first = fields[0]
    if not all(isinstance(f, PartProduct) and f.part.weight == first.part.weight
               for f in fields) or [f.part.start for f in fields] != sorted(
                   {f.part.start for f in fields}):
        raise UnsupportedOpError(f"precision='int8': {name} joins a product by a part of a "
                                 "weight split by channels with other tensors")
    total = rw.emit(R.concat([f.acc.total for f in fields], axis))
    return Accumulator(total, first.acc.exponents)


def add_parts(rw: Rewriter, a, b, add, name: str):
    """The backward: the error into a split layer's input is one term per part, which Relax's
    Gradient adds one after the other, after what the input's other readers gave (`a`) if
    any. The terms are summed in int32 first, then added as the unsplit layer's input error
    would be (`add`, the ordinary rule), so every narrowing is the unsplit step's."""
    if isinstance(b, PendingSum) or (isinstance(a, PartProduct)
                                     and not isinstance(b, PartProduct)):
        a, b = b, a  # the part's term second
    if not isinstance(b, PartProduct):
        raise UnsupportedOpError(f"precision='int8': {name} adds two unfinished sums of "
                                 "layers split by channels")
    if isinstance(a, PendingSum):
        return add(a.other, _terms(rw, a.product, b, name))
    if isinstance(a, PartProduct):
        return _terms(rw, a, b, name)
    return PendingSum(a, b)


def _terms(rw: Rewriter, a: PartProduct, b: PartProduct, name: str) -> Accumulator:
    if a.part.weight != b.part.weight or a.part.start == b.part.start:
        raise UnsupportedOpError(f"precision='int8': {name} adds products by parts of "
                                 f"{a.part.weight} and {b.part.weight}, not one layer's two")
    return Accumulator(rw.emit(R.add(a.acc.total, b.acc.total)), a.acc.exponents)
