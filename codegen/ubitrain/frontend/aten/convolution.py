"""Linear and convolution layers."""

from __future__ import annotations

import math

from tvm.relax import op as R

from .registry import aten, converts, pair, shape_of, unsupported


@converts(aten.linear.default)
def _linear(ctx, node, x, w, b=None):
    """x @ w^T + b. An input of more than 2 dims (a transformer's tokens) is flattened to
    rows first, as PyTorch does: a batched matmul's weight gradient would be one (in, out)
    matrix per leading index, summed afterwards (65x the weight for a ViT's 65 tokens)."""
    lead = shape_of(x)[:-1]
    if len(lead) > 1:
        x = ctx.emit(R.reshape(x, (math.prod(lead), shape_of(x)[-1])))
    y = ctx.emit(R.matmul(x, ctx.emit(R.permute_dims(w, [1, 0]))))
    if b is not None:
        y = ctx.emit(R.add(y, b))
    return ctx.emit(R.reshape(y, (*lead, shape_of(w)[0]))) if len(lead) > 1 else y


def _conv_padding(ctx, padding, kernel, dilation) -> list[int]:
    """[top, left, bottom, right] for integer padding, "valid" or "same". For "same",
    PyTorch splits `dilation * (kernel - 1)` with the odd one at the end."""
    if padding == "valid":
        return [0, 0, 0, 0]
    if padding == "same":
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        return [total[0] // 2, total[1] // 2, total[0] - total[0] // 2, total[1] - total[1] // 2]
    if isinstance(padding, str):
        unsupported(ctx, f"conv padding={padding!r}", "use integers, 'valid' or 'same'")
    ph, pw = pair(padding)
    return [ph, pw, ph, pw]


def _conv2d(ctx, x, w, b, stride, padding, dilation, groups):
    dilation = pair(dilation)
    pad = _conv_padding(ctx, padding, shape_of(w)[2:], dilation)
    y = ctx.emit(R.nn.conv2d(x, w, strides=pair(stride), padding=pad, dilation=dilation,
                             groups=groups))
    if b is not None:
        y = ctx.emit(R.add(y, ctx.emit(R.reshape(b, (1, shape_of(b)[0], 1, 1)))))
    return y


@converts(aten.conv2d.default, aten.conv2d.padding)
def _conv2d_aten(ctx, node, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv2d(ctx, x, w, b, stride, padding, dilation, groups)


@converts(aten.conv1d.default, aten.conv1d.padding)
def _conv1d(ctx, node, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    """Conv1d is a Conv2d over a height of one."""
    n, c, length = shape_of(x)
    o, i, k = shape_of(w)
    x4 = ctx.emit(R.reshape(x, (n, c, 1, length)))
    w4 = ctx.emit(R.reshape(w, (o, i, 1, k)))
    pad = padding if isinstance(padding, str) else [0, pair(padding, 1)[0]]
    y = _conv2d(ctx, x4, w4, b, [1, pair(stride, 1)[0]], pad, [1, pair(dilation, 1)[0]], groups)
    _, _, _, out_len = shape_of(y)
    return ctx.emit(R.reshape(y, (n, o, out_len)))
