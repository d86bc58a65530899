"""The integer forms a float value takes in the NITI rewrite (niti_graph.py): int8 values
with an exponent, an int32 accumulator, an integer parameter, and the markers the rules pass
between them."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax

INT8, INT32 = "int8", "int32"


@dataclass
class Quantized:
    q: relax.Expr  # int8
    e: relax.Expr  # int32 (1,)


@dataclass
class Accumulator:
    total: relax.Expr  # int32
    exponents: list  # int32 (1,) tensors whose sum is its exponent
    error_sum: bool = False  # an error summed over the batch (a bias's gradient)
    view: tuple | None = None  # (accumulator, make): a reshape of it, narrowed as it is


@dataclass(frozen=True)
class Part:
    """Which rows of a weight split by output channels (training/channel_split.py) a
    parameter holds: from `start`, of the weight `weight`, whose exponent it shares."""

    weight: str
    start: int


@dataclass
class Parameter:
    name: str
    var: relax.Var  # int8 (a weight) or int32 (a bias, a BatchNorm's running statistic)
    e: relax.Var | None  # None: a count (BatchNorm's num_batches_tracked), no exponent
    channel_axis: int | None = None  # the axis of `var` whose channels have an exponent
    # each (e of shape [C]; niti/channel_exponents.py); None: one exponent
    part: Part | None = None  # a part of a split weight: `e` is the whole weight's

    @property
    def start(self) -> int:
        """The whole weight's row this parameter's first row is (0 unless a part)."""
        return self.part.start if self.part else 0


@dataclass
class PartProduct:
    """A conv or matmul by a part of a split weight: an int32 sum at the whole weight's
    exponent, that only its other parts' products complete (niti_part_rules.py)."""

    acc: Accumulator
    part: Part


@dataclass
class PendingSum:
    """An error plus the first part's product of a split layer, waiting for its other
    part's (niti_part_rules.py)."""

    other: object  # the integer form the layer's input error is added to
    product: PartProduct


@dataclass
class ZeroGradient:
    """A parameter's adjoint that Relax knows to be zero (its layer reads only padding)."""

    shape: tuple[int, ...]


@dataclass
class BatchNormSaved:
    """What an integer BatchNorm's backward reads from its forward (niti/batch_norm.py)."""

    x_hat: relax.Expr  # int8 at exponent -F
    r: relax.Expr  # int64 [C]
    g: relax.Expr  # int32 [C]
    x_e: relax.Expr  # the input's exponent


@dataclass
class Mask:
    mask: relax.Expr  # bool


def shape_of(expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)
