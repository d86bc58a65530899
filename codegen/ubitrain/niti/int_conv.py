"""The three integer convolutions of a training step, exact in int64 (numpy).

Layouts: x [B, C, H, W], w [O, C/groups, KH, KW], y / error [B, O, OH, OW]. Each sums over
the kernel offsets (i, j) of strided slices of the zero-padded input, so every product is
exact. A grouped (or depthwise) convolution is `groups` independent ones over consecutive
channel blocks of x and of the output.
"""

from __future__ import annotations

import numpy as np

from .rounding import as_i64


def _window(a: np.ndarray, i: int, j: int, stride, out_hw) -> tuple:
    sh, sw = stride
    oh, ow = out_hw
    return (slice(None), slice(None), slice(i, i + sh * (oh - 1) + 1, sh),
            slice(j, j + sw * (ow - 1) + 1, sw))


def _pad(x, padding):
    ph, pw = padding
    return np.pad(as_i64(x), ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _split(a, groups: int, axis: int) -> list[np.ndarray]:
    return np.split(as_i64(a), groups, axis=axis)


def conv2d(x, w, stride, padding, groups: int = 1) -> np.ndarray:
    if groups > 1:
        return np.concatenate([conv2d(xg, wg, stride, padding) for xg, wg in zip(
            _split(x, groups, 1), _split(w, groups, 0))], axis=1)
    xp, w = _pad(x, padding), as_i64(w)
    o, _, kh, kw = w.shape
    oh = (xp.shape[2] - kh) // stride[0] + 1
    ow = (xp.shape[3] - kw) // stride[1] + 1
    y = np.zeros((xp.shape[0], o, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("bchw,oc->bohw", xp[_window(xp, i, j, stride, (oh, ow))], w[:, :, i, j])
    return y


def conv2d_weight_grad(x, err, kernel, stride, padding, groups: int = 1) -> np.ndarray:
    if groups > 1:
        return np.concatenate([conv2d_weight_grad(xg, eg, kernel, stride, padding) for xg, eg
                               in zip(_split(x, groups, 1), _split(err, groups, 1))], axis=0)
    xp, err = _pad(x, padding), as_i64(err)
    kh, kw = kernel
    oh, ow = err.shape[2:]
    g = np.zeros((err.shape[1], xp.shape[1], kh, kw), np.int64)
    for i in range(kh):
        for j in range(kw):
            g[:, :, i, j] = np.einsum("bohw,bchw->oc", err, xp[_window(xp, i, j, stride, (oh, ow))])
    return g


def conv2d_input_grad(err, w, in_shape, stride, padding, groups: int = 1) -> np.ndarray:
    if groups > 1:
        b, c, h, wd = in_shape
        return np.concatenate([conv2d_input_grad(eg, wg, (b, c // groups, h, wd), stride,
                                                 padding)
                               for eg, wg in zip(_split(err, groups, 1), _split(w, groups, 0))],
                              axis=1)
    err, w = as_i64(err), as_i64(w)
    b, c, h, wd = in_shape
    ph, pw = padding
    ep = np.zeros((b, c, h + 2 * ph, wd + 2 * pw), np.int64)
    oh, ow = err.shape[2:]
    for i in range(w.shape[2]):
        for j in range(w.shape[3]):
            part = np.einsum("bohw,oc->bchw", err, w[:, :, i, j])
            ep[_window(ep, i, j, stride, (oh, ow))] += part
    return ep[:, :, ph:ph + h, pw:pw + wd]
