"""An elementwise function that precision="int8" computes by compile-time table
(niti/tables.py), as one fused op each way, so that the integer rewrite
(training/niti_table_rules.py) sees the function and its backward whole, not the float
arithmetic of their Relax forms (sigmoid's backward reads its output; hardswish is a clip, a
product and a division).

The int8 pipeline traces with TABLE_CONVERTERS in place of the float converters of these
ATen ops (frontend/aten/activations.py); the float pipeline never meets the op.
"""

from __future__ import annotations

import torch

from .fused_ops import fused_call

FORWARD = "table_activation"
BACKWARD = "table_activation_backward"
aten = torch.ops.aten


def table_activation_grad(orig_var, tensors, output_grad, attrs):
    (x,) = tensors
    return [fused_call(BACKWARD, [x, output_grad], x.ty, **attrs)]


def _converter(function: str):
    def convert(ctx, node, x, approximate: str | None = None):
        options = {} if approximate in (None, "none") else {"approximate": approximate}
        return ctx.emit(fused_call(FORWARD, [x], x.ty, function=function, **options))
    return convert


TABLE_CONVERTERS = {
    aten.sigmoid.default: _converter("aten.sigmoid"),
    aten.tanh.default: _converter("aten.tanh"),
    aten.silu.default: _converter("aten.silu"),
    aten.gelu.default: _converter("aten.gelu"),
    aten.hardswish.default: _converter("aten.hardswish"),
    aten.hardsigmoid.default: _converter("aten.hardsigmoid"),
}
