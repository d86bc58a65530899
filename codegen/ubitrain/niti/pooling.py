"""Pooling on int8 values over windows that tile the input, and its backward: max pooling
(the error of each window to its first maximum in row-major order) and average pooling (a
sum times a fixed-point reciprocal; a global average is one window over the whole map)."""

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


AVERAGE_BITS = 16  # an average is a sum times round(2^16 / n) at exponent e - 16


def reciprocal(n: int) -> int:
    """round(2^AVERAGE_BITS / n), half up: the integer factor of an average of n terms."""
    return ((1 << AVERAGE_BITS) + n // 2) // n


def avg_pool(x, kernel) -> np.ndarray:
    """Average pooling over windows that tile x (a global average when `kernel` is x's
    height and width): each window's int32 sum times reciprocal(kh kw), at exponent
    e - AVERAGE_BITS. Exact in int32: |sum| <= 127 n, so the product stays below 2^23."""
    b, c, h, w = x.shape
    kh, kw = kernel
    oh, ow = h // kh, w // kw
    win = as_i64(x)[:, :, :oh * kh, :ow * kw].reshape(b, c, oh, kh, ow, kw)
    return win.sum(axis=(3, 5)) * reciprocal(kh * kw)


def avg_pool_backward(err, kernel, in_shape) -> np.ndarray:
    """Each window's error times reciprocal(kh kw), spread over the window (exponent
    e - AVERAGE_BITS); rows and columns no window covers get 0."""
    kh, kw = kernel
    spread = np.repeat(np.repeat(as_i64(err) * reciprocal(kh * kw), kh, axis=2), kw, axis=3)
    full = np.zeros(in_shape, np.int64)
    full[:, :, :spread.shape[2], :spread.shape[3]] = spread
    return full
