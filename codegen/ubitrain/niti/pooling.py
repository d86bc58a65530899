"""Max pooling on int8 values over windows that tile the input, and its backward: the error
of each window to its first maximum in row-major order."""

from __future__ import annotations

import numpy as np

from .rounding import as_i64


def max_pool(x, kernel) -> np.ndarray:
    b, c, h, w = x.shape
    kh, kw = kernel
    oh, ow = h // kh, w // kw
    win = as_i64(x)[:, :, :oh * kh, :ow * kw].reshape(b, c, oh, kh, ow, kw)
    return win.max(axis=(3, 5))


def max_pool_backward(x, err, kernel) -> np.ndarray:
    """The error of each window to its first maximum in row-major order."""
    b, c, h, w = x.shape
    kh, kw = kernel
    oh, ow = err.shape[2:]
    win = as_i64(x)[:, :, :oh * kh, :ow * kw].reshape(b, c, oh, kh, ow, kw)
    flat = win.transpose(0, 1, 2, 4, 3, 5).reshape(b, c, oh, ow, kh * kw)
    first = flat.argmax(axis=-1)  # numpy's argmax takes the first of equal maxima
    out = np.zeros((b, c, oh, ow, kh * kw), np.int64)
    np.put_along_axis(out, first[..., None], as_i64(err)[..., None], axis=-1)
    out = out.reshape(b, c, oh, ow, kh, kw).transpose(0, 1, 2, 4, 3, 5)
    full = np.zeros((b, c, h, w), np.int64)
    full[:, :, :oh * kh, :ow * kw] = out.reshape(b, c, oh * kh, ow * kw)
    return full
