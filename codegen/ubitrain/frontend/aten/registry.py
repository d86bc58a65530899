"""The converter table and what every converter shares: the context, shapes, errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import tvm
from tvm import relax
from tvm.relax import op as R

from ...errors import UnsupportedOpError

aten = torch.ops.aten
ATEN_CONVERTERS: dict = {}


@dataclass
class ConvertContext:
    bb: relax.BlockBuilder
    training: bool
    where: str = "<top>"
    converters: dict = field(default_factory=dict)  # ATen op -> converter, in place of ours
    random_masks: list = field(default_factory=list)  # forward.RandomMask, in graph order
    model_inputs: frozenset = frozenset()  # names of the placeholders that are model inputs
    # model input name -> ids must lie in [0, bound): the step checks it (UB_ERR_INDEX_RANGE)
    index_bounds: dict = field(default_factory=dict)

    def emit(self, expr):
        return self.bb.emit(expr)


def converts(*targets):
    def register(fn):
        for t in targets:
            ATEN_CONVERTERS[t] = fn
        return fn
    return register


def supported_op_names() -> list[str]:
    names = set()
    for t in ATEN_CONVERTERS:
        packet = getattr(t, "_overloadpacket", None)
        name = "aten." + str(packet).split(".")[-1] if packet else getattr(t, "__name__", str(t))
        names.add(name)
    return sorted(names - {"getitem"})


def shape_of(x) -> tuple[int, ...]:
    return tuple(int(d) for d in x.ty.shape)


def dtype_of(x) -> str:
    return str(x.ty.dtype)


def torch_dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def result_dtype(node, *values) -> str:
    """The dtype of the op's result as PyTorch traced it (its type promotion: a float tensor
    plus an int64 `arange` is float), else that of the first tensor operand."""
    val = node.meta.get("val") if node is not None else None
    if isinstance(val, torch.Tensor):
        return torch_dtype_name(val.dtype)
    return next(dtype_of(v) for v in values if isinstance(v, relax.Expr))


def cast(ctx, value, dtype: str):
    """A Python scalar or a tensor as `dtype`: a constant converted now, else by a kernel."""
    if not isinstance(value, relax.Expr):
        return relax.const(value, dtype)
    if dtype_of(value) == dtype:
        return value
    if isinstance(value, tvm.ir.Constant):
        return relax.const(value.value.numpy().astype(dtype), dtype)
    return ctx.emit(R.astype(value, dtype))


def as_expr(value, like):
    """A Python scalar becomes a Relax constant of the other operand's dtype."""
    if isinstance(value, relax.Expr):
        return value
    return relax.const(value, dtype_of(like))


def pair(v, n=2):
    if isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


def axes(dims, rank):
    """Reduction axes as PyTorch reads them: None and an empty list both mean all axes."""
    dims = [dims] if isinstance(dims, int) else dims
    if not dims:
        return list(range(rank))
    return sorted(d % rank for d in dims)


def unsupported(ctx, what: str, instead: str):
    raise UnsupportedOpError(f"{ctx.where}: {what} is not supported; {instead}")
