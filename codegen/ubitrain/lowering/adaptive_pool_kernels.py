"""TE kernels of the fused adaptive pools (training/adaptive_pool.py), NCHW.

Along an axis of input size `size` and output size `out`, window i covers
[start(i), end(i)) = [floor(i * size / out), ceil((i + 1) * size / out)), PyTorch's
`start_index` / `end_index`. Conversely, input element h lies in windows
floor(h * out / size) through ceil((h + 1) * out / size) - 1: the same formula with the
roles swapped. So the forward reduces over the longest window (taps past a window's end
masked off) and the backward has each input element gather from at most the largest number
of windows that share an element: every element is written once, no scatter.

The average sums in `acc` and divides by the window's own size, as PyTorch does; the
gradient gives each window's dy / size to every element of the window. The max keeps
PyTorch's first maximum in scan order (`pool_grad._first_max`); its gradient finds that
element again from x.
"""

from __future__ import annotations

from tvm import te, tirx

from ..ops.pool_grad import _first_max


def _ceil_div(a, b):
    return (a + b - 1) // b


class _Axis:
    """The windows of one axis: `size` inputs pooled to `out` outputs."""

    def __init__(self, size: int, out: int):
        self.size, self.out = size, out
        # the longest window, and the most windows holding one element (both >= 1)
        self.taps = max(_ceil_div((i + 1) * size, out) - i * size // out for i in range(out))
        self.holders = max(_ceil_div((h + 1) * out, size) - h * out // size
                           for h in range(size))

    def start(self, i):
        return tirx.floordiv(i * self.size, self.out)

    def end(self, i):
        return tirx.floordiv((i + 1) * self.size + self.out - 1, self.out)

    def first_window(self, h):
        return tirx.floordiv(h * self.out, self.size)

    def last_window(self, h):
        return tirx.floordiv((h + 1) * self.out + self.size - 1, self.size) - 1


def _axes(in_shape, out_shape):
    return [_Axis(int(s), int(o)) for s, o in zip(list(in_shape)[2:], list(out_shape)[2:])]


def _gather(dy, in_shape, term, name):
    """dx[b, c, h, w]: the sum of `term(b, c, i, j)` over the windows (i, j) holding (h, w)."""
    ah, aw = _axes(in_shape, dy.shape)
    ri = te.reduce_axis((0, ah.holders), name="ri")
    rj = te.reduce_axis((0, aw.holders), name="rj")

    def grad(b, c, h, w):
        i, j = ah.first_window(h) + ri, aw.first_window(w) + rj
        holds = tirx.all(i <= ah.last_window(h), j <= aw.last_window(w))
        return te.sum(tirx.if_then_else(holds, term(b, c, h, w, i, j),
                                        tirx.const(0, dy.dtype)), axis=[ri, rj])

    return te.compute([int(d) for d in in_shape], grad, name=name)


def adaptive_avg_pool2d(x, out, acc: str):
    shape = [int(d) for d in x.shape]
    out_shape = [*shape[:2], *out]
    ah, aw = _axes(shape, out_shape)
    rh = te.reduce_axis((0, ah.taps), name="rh")
    rw = te.reduce_axis((0, aw.taps), name="rw")

    def window_sum(b, c, i, j):
        h, w = ah.start(i) + rh, aw.start(j) + rw
        inside = tirx.all(h < ah.end(i), w < aw.end(j))
        return te.sum(tirx.if_then_else(inside, x[b, c, h, w].astype(acc), tirx.const(0, acc)),
                      axis=[rh, rw])

    total = te.compute(out_shape, window_sum, name="adaptive_avg_sum")

    def average(b, c, i, j):
        count = (ah.end(i) - ah.start(i)) * (aw.end(j) - aw.start(j))
        return (total[b, c, i, j] / count.astype(acc)).astype(x.dtype)

    return te.compute(out_shape, average, name="adaptive_avg_pool2d")


def adaptive_avg_pool2d_backward(dy, in_size, acc: str):
    shape = [*(int(d) for d in list(dy.shape)[:2]), *in_size]
    ah, aw = _axes(shape, dy.shape)

    def share(b, c, h, w, i, j):
        count = (ah.end(i) - ah.start(i)) * (aw.end(j) - aw.start(j))
        return dy[b, c, i, j] / count.astype(dy.dtype)

    return _gather(dy, shape, share, "adaptive_avg_pool2d_grad")


def _window_max(x, out_shape):
    """(index h * W + w of the first maximum, its value) per window."""
    ah, aw = _axes(x.shape, out_shape)
    width = int(x.shape[3])
    first_max = _first_max("int32", x.dtype)
    rh = te.reduce_axis((0, ah.taps), name="rh")
    rw = te.reduce_axis((0, aw.taps), name="rw")

    def window_max(b, c, i, j):
        h, w = ah.start(i) + rh, aw.start(j) + rw
        inside = tirx.all(h < ah.end(i), w < aw.end(j))
        index = tirx.if_then_else(inside, h * width + w, -1)  # -1: past the end, never wins
        value = tirx.if_then_else(inside, x[b, c, h, w], tirx.const(0, x.dtype))
        return first_max((index.astype("int32"), value), axis=[rh, rw])

    return te.compute(out_shape, window_max, name="adaptive_max_pool2d_argmax")


def adaptive_max_pool2d(x, out, acc: str):
    _, value = _window_max(x, [*(int(d) for d in list(x.shape)[:2]), *out])
    return value


def adaptive_max_pool2d_backward(dy, x, acc: str):
    argmax, _ = _window_max(x, [int(d) for d in dy.shape])
    width = int(x.shape[3])

    def routed(b, c, h, w, i, j):
        return tirx.if_then_else(argmax[b, c, i, j] == h * width + w, dy[b, c, i, j],
                                 tirx.const(0, dy.dtype))

    return _gather(dy, x.shape, routed, "adaptive_max_pool2d_grad")
