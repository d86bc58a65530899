"""The rules of NITI's integer training (niti/, the spec of the int8 step and of its numpy
reference) against independent computations: Python integers for the rounding rules,
PyTorch float64 convolutions and autograd for the int32 accumulations, float softmax for
the loss gradient, PyTorch's functions and gradients for the tables."""

import numpy as np
import pytest
import torch
from torch import nn

from ubitrain.niti import int_conv, loss, pooling, quantize, rounding, tables
from ubitrain.niti.pooling import max_pool_backward

RNG = np.random.default_rng(0)
VALUES = np.concatenate([np.arange(-600, 601), RNG.integers(-2**30, 2**30, 4000)])


def test_bitlen_and_shift_match_python_ints():
    assert list(rounding.bitlen(VALUES)) == [abs(int(v)).bit_length() for v in VALUES]
    # the edge case: a maximum of exactly 128 shifts by one, 127 not at all
    assert rounding.shift_for(np.array([128, -5])) == 1
    assert rounding.shift_for(np.array([-127, 3])) == 0
    assert rounding.shift_for(np.array([0, 0])) == 0


@pytest.mark.parametrize("s", [1, 2, 3, 4, 7, 12])
def test_round_shift_is_half_away_and_trunc_shift_toward_zero(s):
    for v in VALUES[::7]:
        v = int(v)
        q, r = divmod(abs(v), 2 ** s)
        away = q + (2 * r >= 2 ** s)
        assert rounding.round_shift(v, s) == (away if v >= 0 else -away)
        assert rounding.trunc_shift(v, s) == (q if v >= 0 else -q)
    assert rounding.trunc_shift(-5, 1) == -2  # numpy's floor division would give -3
    assert rounding.trunc_div(-7, 2) == -3


@pytest.mark.parametrize("s", [1, 2, 3, 4, 5, 8])
def test_psto_shift_rounds_up_by_the_fraction_of_its_high_bits(s):
    low = s // 2
    for v in VALUES[::13]:
        v = int(v)
        q, r = divmod(abs(v), 2 ** s)
        high, noise = r >> low, (r & ((1 << low) - 1)) << (s % 2)
        got = int(rounding.psto_shift(v, s))
        assert abs(got) in (q, q + 1) and (got >= 0) == (v >= 0 or got == 0)
        assert abs(got) == q + (high > noise)
    # over all remainders with one high half, the share rounded up is high / 2^low (s even)
    if s % 2 == 0:
        for high in range(2 ** (s - low)):
            rs = high * 2 ** low + np.arange(2 ** low)
            assert rounding.psto_shift(rs, s).mean() == pytest.approx(high / 2 ** low)


def test_quantize_uses_the_float_bits_exactly():
    x = np.float32([0.3, -1.7, 2.0 ** -140, 96.0, -127.9, 1e-3])
    q, e = quantize.quantize(x)
    # max 127.9 < 2^7: exponent 0; values rounded half away from zero, clipped
    assert e == 0 and list(q) == [0, -2, 0, 96, -127, 0]
    q, e = quantize.quantize(np.float32([128.0]))
    assert (int(q[0]), e) == (64, 1)
    x = RNG.standard_normal(1000).astype(np.float32)
    q, e = quantize.quantize(x)
    exact = np.float64(x) / 2.0 ** e
    want = np.clip(np.sign(exact) * np.floor(np.abs(exact) + 0.5), -127, 127)
    assert np.array_equal(q, want) and np.abs(exact).max() < 128
    assert np.abs(exact).max() >= 64  # the exponent is the smallest that fits
    assert np.array_equal(quantize.dequantize(q, e), np.float32(q) * np.float32(2.0 ** e))


def _torch_conv(x, w, stride, padding, groups):
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    return xt, wt, torch.nn.functional.conv2d(xt, wt, stride=stride, padding=padding,
                                              groups=groups)


@pytest.mark.parametrize("stride,padding,groups,out", [
    ((1, 1), (1, 1), 1, 5), ((2, 1), (0, 2), 1, 5), ((1, 1), (1, 1), 2, 6),
    ((2, 2), (1, 1), 4, 4)], ids=["plain", "strided", "grouped", "depthwise"])
def test_int32_convolutions_equal_float64_convolutions_of_the_ints(stride, padding, groups, out):
    x = RNG.integers(-127, 128, (3, 4, 7, 6))
    w = RNG.integers(-127, 128, (out, 4 // groups, 3, 3))
    xt, wt, yt = _torch_conv(x, w, stride, padding, groups)
    y = int_conv.conv2d(x, w, stride, padding, groups)
    assert np.array_equal(y, yt.detach().numpy().astype(np.int64))
    err = RNG.integers(-127, 128, y.shape)
    (yt * torch.tensor(err, dtype=torch.float64)).sum().backward()
    assert np.array_equal(int_conv.conv2d_weight_grad(x, err, (3, 3), stride, padding, groups),
                          wt.grad.numpy().astype(np.int64))
    assert np.array_equal(int_conv.conv2d_input_grad(err, w, x.shape, stride, padding, groups),
                          xt.grad.numpy().astype(np.int64))


def test_max_pool_backward_matches_autograd_without_ties():
    x = RNG.permutation(2 * 3 * 4 * 6).reshape(2, 3, 4, 6) - 60  # distinct: no ties
    err = RNG.integers(-127, 128, (2, 3, 2, 3))
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    pooled = torch.nn.functional.max_pool2d(xt, 2)
    (pooled * torch.tensor(err, dtype=torch.float64)).sum().backward()
    assert np.array_equal(max_pool_backward(x, err, (2, 2)), xt.grad.numpy().astype(np.int64))


@pytest.mark.parametrize("kernel", [(2, 2), (2, 3), (7, 5)], ids=["2x2", "2x3_crops", "global"])
def test_average_pooling_is_torchs_up_to_the_reciprocals_rounding(kernel):
    """avg_pool's sum times round(2^16/n) at exponent -16 is torch's average, off by at most
    the reciprocal's rounding (n/2 of 2^16 relative, plus one unit); the backward spreads
    the same share to each window's elements, as autograd does."""
    x = RNG.integers(-127, 128, (2, 3, 7, 5))
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.avg_pool2d(xt, kernel)
    y = pooling.avg_pool(x, kernel) / 2.0 ** pooling.AVERAGE_BITS
    n = kernel[0] * kernel[1]
    assert np.abs(y - yt.detach().numpy()).max() <= 127 * n / 2 ** 17 + 1e-12
    err = RNG.integers(-127, 128, yt.shape)
    (yt * torch.tensor(err, dtype=torch.float64)).sum().backward()
    got = pooling.avg_pool_backward(err, kernel, x.shape) / 2.0 ** pooling.AVERAGE_BITS
    assert np.abs(got - xt.grad.numpy()).max() <= 127 / 2 ** 17 + 1e-12
    assert np.array_equal(got == 0, xt.grad.numpy() == 0)


def test_integer_softmax_gradient_follows_the_float_one():
    z = RNG.integers(-127, 128, (64, 10))
    labels = RNG.integers(0, 10, 64)
    for exponent in (-6, -4, -2):
        g = loss.softmax_xent_grad(z, exponent, labels).astype(np.int64)
        p = torch.softmax(torch.tensor(z * 2.0 ** exponent), dim=1).numpy()
        p[np.arange(64), labels] -= 1
        target = g[np.arange(64), labels]
        assert np.all(target <= 0) and np.all(np.delete(g, labels + 10 * np.arange(64)) >= 0)
        assert np.all(np.abs(g.sum(axis=1)) <= 10)  # softmax - one-hot sums to zero
        # base-2 exponents of integer steps: probabilities within a factor of two, in Q7
        assert np.corrcoef(g.ravel(), p.ravel())[0, 1] > 0.9
        assert np.abs(target / 128 - p[np.arange(64), labels]).max() < 0.5
    assert loss.cross_entropy(z, -4, labels) == pytest.approx(
        float(nn.functional.cross_entropy(torch.tensor(z / 16.0), torch.tensor(labels))))


@pytest.mark.parametrize("op,torch_fn", [
    ("aten.gelu", torch.nn.functional.gelu), ("aten.sigmoid", torch.sigmoid),
    ("aten.tanh", torch.tanh), ("aten.silu", torch.nn.functional.silu),
    ("aten.hardswish", torch.nn.functional.hardswish),
    ("aten.hardsigmoid", torch.nn.functional.hardsigmoid)])
def test_tables_follow_the_float_function_and_its_gradient(op, torch_fn):
    f, f_exp, d, d_exp = tables.tables(op)
    for row in (0, 10, 14, 18, len(f_exp) - 1):
        e = tables.E_LO + row
        x = torch.arange(-128, 128, dtype=torch.float64) * 2.0 ** e
        x.requires_grad_(True)
        y = torch_fn(x)
        y.sum().backward()
        # within one LSB of each table's own exponent (rounding to int8)
        assert np.abs(f[row] * 2.0 ** f_exp[row] - y.detach().numpy()).max() <= 2.0 ** f_exp[row]
        assert np.abs(d[row] * 2.0 ** d_exp[row] - x.grad.numpy()).max() <= 2.0 ** d_exp[row]
    col, row = tables.table_index(np.array([127, -3]), tables.E_LO - 2)  # brought up to E_LO
    assert row == 0 and list(col - 128) == [32, -1]
