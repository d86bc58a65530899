"""The NITI rewrite's rules for an elementwise function by compile-time table
(ops/table_activation.py, spec niti/tables.py): the forward looks up F_e[q] at the table's
exponent; the backward multiplies the int8 error by D_e[q], an int32 accumulator at the
error's exponent plus the table's, narrowed where it is read as every error is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tvm import relax

from ..niti.tables import tables
from ..ops import niti
from .niti_values import Accumulator, Quantized

if TYPE_CHECKING:
    from .niti_graph import Rewriter


def _tables(attrs: dict, derivative: bool) -> tuple[relax.Constant, relax.Constant]:
    options = {k: v for k, v in attrs.items() if k != "function"}
    f, f_exp, d, d_exp = tables(attrs["function"], **options)
    values, exponents = (d, d_exp) if derivative else (f, f_exp)
    return relax.const(values), relax.const(exponents)


def table_forward(rw: Rewriter, args, attrs: dict) -> Quantized:
    x = rw.quantized(args[0], attrs["function"])
    out = rw.emit(niti.table(x.q, x.e, *_tables(attrs, False)))
    return Quantized(rw.emit(relax.TupleGetItem(out, 0)), rw.emit(relax.TupleGetItem(out, 1)))


def table_backward(rw: Rewriter, args, attrs: dict) -> Accumulator:
    where = f"{attrs['function']}'s backward"
    x, err = rw.quantized(args[0], where), rw.quantized(args[1], where)
    out = rw.emit(niti.table_grad(err.q, x.q, x.e, *_tables(attrs, True)))
    return Accumulator(rw.emit(relax.TupleGetItem(out, 0)),
                       [err.e, rw.emit(relax.TupleGetItem(out, 1))])
