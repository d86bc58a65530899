"""TE kernels for pooling gradients where TVM's own rule differs from PyTorch.

`avg_pool2d_backward`: TVM 0.27's `avg_pool2d_backward` divides by a different window size
than its forward (and PyTorch) in ceil mode, for windows cut by the end of the padded input.
This kernel follows PyTorch's `avg_pool2d` exactly: the window of output (oh, ow) starts at
`oh * stride - pad`, is cut at `size + pad` (that cut size is the divisor when padding
counts), and at the input's edges (that size is the divisor when it does not). Each input
element gathers `dy / divisor` from the at most ceil(kernel / stride) windows per axis that
hold it, so the kernel writes every element once and needs no scatter.
"""

from __future__ import annotations

from tvm import te, tirx


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def avg_pool2d_backward(dy: te.Tensor, in_shape, pool_size, strides, padding,
                        count_include_pad: bool) -> te.Tensor:
    """The gradient of NCHW `avg_pool2d` w.r.t. its input, shaped `in_shape`."""
    n, c, height, width = (int(d) for d in in_shape)
    out_h, out_w = (int(d) for d in dy.shape[2:])
    kh, kw = (int(k) for k in pool_size)
    sh, sw = (int(s) for s in strides)
    pad_top, pad_left, pad_bottom, pad_right = (int(p) for p in padding)
    rh = te.reduce_axis((0, _ceil_div(kh, sh)), name="rh")
    rw = te.reduce_axis((0, _ceil_div(kw, sw)), name="rw")

    def extent(o, stride, k, pad_lo, pad_hi, size):
        start = o * stride - pad_lo
        end = tirx.min(start + k, size + pad_hi)
        if count_include_pad:
            return end - start
        return tirx.min(end, size) - tirx.max(start, 0)

    def grad(b, ch, h, w):
        oh = tirx.floordiv(h + pad_top, sh) - rh
        ow = tirx.floordiv(w + pad_left, sw) - rw
        inside = tirx.all(oh >= 0, oh < out_h, h + pad_top - oh * sh < kh,
                          ow >= 0, ow < out_w, w + pad_left - ow * sw < kw)
        divisor = (extent(oh, sh, kh, pad_top, pad_bottom, height)
                   * extent(ow, sw, kw, pad_left, pad_right, width))
        term = dy[b, ch, oh, ow] / divisor.astype(dy.dtype)
        return te.sum(tirx.if_then_else(inside, term, tirx.const(0, dy.dtype)), axis=[rh, rw])

    return te.compute((n, c, height, width), grad, name="avg_pool2d_grad")


def _first_max(index_dtype: str, value_dtype: str):
    """Reducer over (input index, value) pairs that keeps PyTorch's max: the first element
    in scan order, replaced only by a strictly greater value or a NaN. Index -1 marks a
    padding tap, which never wins."""

    def combine(acc, new):
        take = tirx.all(new[0] >= 0, tirx.any(acc[0] < 0, new[1] > acc[1], tirx.isnan(new[1])))
        return tirx.Select(take, new[0], acc[0]), tirx.Select(take, new[1], acc[1])

    def identity(t0, t1):
        return tirx.const(-1, t0), tirx.const(0, t1)

    return te.comm_reducer(combine, identity, name="first_max")


def max_pool2d_backward(dy: te.Tensor, x: te.Tensor, pool_size, strides, padding,
                        dilation) -> te.Tensor:
    """The gradient of NCHW `max_pool2d` w.r.t. its input, with PyTorch's semantics.

    Each window's gradient goes to one element: the first maximum in scan order (row by
    row), as PyTorch's kernel picks it; padding never wins. A first stage records that
    element's index per window; the second has each input element gather from the windows
    (at most one per kernel tap and axis) whose recorded index is its own. Dilation and
    ceil mode (a last window cut by the input's end) follow from the window geometry.
    """
    n, c, height, width = (int(d) for d in x.shape)
    out_h, out_w = (int(d) for d in dy.shape[2:])
    kh, kw = (int(k) for k in pool_size)
    sh, sw = (int(s) for s in strides)
    pad_top, pad_left = int(padding[0]), int(padding[1])
    dh, dw = (int(d) for d in dilation)
    first_max = _first_max("int32", x.dtype)

    ri = te.reduce_axis((0, kh), name="ri")
    rj = te.reduce_axis((0, kw), name="rj")

    def window_max(b, ch, oh, ow):
        h = oh * sh - pad_top + ri * dh
        w = ow * sw - pad_left + rj * dw
        inside = tirx.all(h >= 0, h < height, w >= 0, w < width)
        index = tirx.if_then_else(inside, h * width + w, -1)
        value = tirx.if_then_else(inside, x[b, ch, h, w], tirx.const(0, x.dtype))
        return first_max((index.astype("int32"), value), axis=[ri, rj])

    argmax, _ = te.compute((n, c, out_h, out_w), window_max, name="max_pool2d_argmax")

    gi = te.reduce_axis((0, kh), name="gi")
    gj = te.reduce_axis((0, kw), name="gj")

    def grad(b, ch, h, w):
        # The window (oh, ow) holds (h, w) at tap (gi, gj) if oh * s = h + pad - gi * d.
        nh = h + pad_top - gi * dh
        nw = w + pad_left - gj * dw
        # Divided as max(n, 0), equal to n wherever `holds`: TVM's FlattenBuffer rewrote the
        # window index floordiv(1 - gj, 3) as gj // -3 (-1 at gj = 1, where it is 0), and the
        # gradient read before its buffer (fuzz seed 50298: max_pool1d(3, padding=1) of width 1)
        oh = tirx.floordiv(tirx.max(nh, 0), sh)
        ow = tirx.floordiv(tirx.max(nw, 0), sw)
        holds = tirx.all(nh >= 0, tirx.floormod(nh, sh) == 0, oh < out_h,
                         nw >= 0, tirx.floormod(nw, sw) == 0, ow < out_w)
        won = tirx.if_then_else(holds, argmax[b, ch, oh, ow] == h * width + w, False)
        return te.sum(tirx.if_then_else(won, dy[b, ch, oh, ow], tirx.const(0, dy.dtype)),
                      axis=[gi, gj])

    return te.compute((n, c, height, width), grad, name="max_pool2d_grad")
