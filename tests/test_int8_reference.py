"""The numpy reference of NITI's integer training (ubitrain.int8) against independent
computations: Python integers for the rounding rules, PyTorch float64 convolutions and
autograd for the int32 accumulations, float softmax for the loss gradient."""

import numpy as np
import pytest
import torch
from niti_harness import niti_net
from torch import nn

import ubitrain as ub
from ubitrain.int8.lower import lower_module
from ubitrain.int8.reference import NitiReference
from ubitrain.int8.update import NITI
from ubitrain.niti import int_conv, loss, pooling, quantize, rounding
from ubitrain.niti.pooling import max_pool_backward
from ubitrain.niti.rescale import INTERVAL, REDUCTIONS, SHIFT, SITE_FIELDS, SKIPS

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


def test_reference_step_against_independent_pieces():
    """One step by hand from PyTorch float64 convolutions of the integer tensors."""
    x = torch.randn(4, 1, 8, 8)
    y = np.array([0, 1, 2, 3])
    program = lower_module(niti_net(), x)
    ref = NitiReference(program, NITI(mu=(4,), milestones=()))
    w0 = {k: v.copy() for k, v in ref.weights.items()}
    ref.step(x.numpy(), y)
    c1, c2, fc = program.convs()

    def fwd(a, w, conv):
        w4 = w.reshape(conv.out_shape[1], -1, *conv.kernel)
        acc = torch.nn.functional.conv2d(torch.tensor(a, dtype=torch.float64),
                                         torch.tensor(w4, dtype=torch.float64),
                                         stride=conv.stride, padding=conv.padding).numpy()
        s = max(0, int(np.abs(acc).max()).bit_length() - 7)
        out = np.sign(acc) * np.floor(np.abs(acc) / 2 ** s + 0.5)
        return np.clip(out, -127, 127).astype(np.int64), acc

    x8, _ = quantize.quantize(x.numpy())
    h1, _ = fwd(x8, w0[c1.weight], c1)
    p1 = torch.nn.functional.max_pool2d(torch.tensor(np.maximum(h1, 0), dtype=torch.float64), 2)
    h2, _ = fwd(p1.numpy(), w0[c2.weight], c2)
    flat = np.maximum(h2, 0).reshape(4, -1)
    logits, _ = fwd(flat.reshape(4, 32, 1, 1), w0[fc.weight], fc)
    e_logits = ref.site(fc.fwd_site)[-1]
    err = loss.softmax_xent_grad(logits.reshape(4, 5), int(e_logits), y).astype(np.float64)
    grad = err.T @ flat  # the last layer's weight gradient, float64
    s = max(0, int(np.abs(grad).max()).bit_length() - 4)
    want = np.clip(w0[fc.weight] - rounding.psto_shift(grad.astype(np.int64), s), -127, 127)
    assert np.array_equal(ref.weights[fc.weight], want)
    assert np.any(want != w0[fc.weight])


def test_adaptive_rescaling_skips_reductions_and_learns_intervals():
    x = torch.randn(8, 1, 8, 8)
    program = lower_module(niti_net(), x)
    gen = np.random.default_rng(1)
    batches = [(gen.standard_normal((8, 1, 8, 8)).astype(np.float32), gen.integers(0, 5, 8))
               for _ in range(30)]
    exact = NitiReference(program, NITI(mu=(4,), milestones=()))
    adaptive = NitiReference(program, NITI(mu=(4,), milestones=(), adaptive_rescale=True,
                                           max_interval=8))
    for xb, yb in batches:
        exact.step(xb, yb)
        adaptive.step(xb, yb)
    sites = exact.state[2:].reshape(-1, SITE_FIELDS)
    assert np.all(sites[:, REDUCTIONS] == 30) and np.all(sites[:, SKIPS] == 0)
    sites = adaptive.state[2:].reshape(-1, SITE_FIELDS)
    assert np.all(sites[:, REDUCTIONS] + sites[:, SKIPS] == 30)
    assert sites[:, SKIPS].sum() > sites[:, REDUCTIONS].sum()  # most reductions skipped
    assert np.all(sites[:, INTERVAL] >= 1) and np.all(sites[:, INTERVAL] <= 8)
    # a skipped site never ran with a shift smaller than the exact one (saturation check)
    assert np.all(sites[:, SHIFT] >= 0)


def test_unsupported_ops_are_named():
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.LayerNorm(8), nn.GELU(),
                          nn.Linear(8, 3, bias=False))
    with pytest.raises(ub.UnsupportedOpError, match=r"aten\.layer_norm.*aten\.gelu"):
        lower_module(model, torch.randn(2, 8))
    with pytest.raises(ub.UnsupportedOpError, match="bias=False"):
        lower_module(nn.Sequential(nn.Linear(8, 3)), torch.randn(2, 8))


@pytest.mark.parametrize("op,torch_fn", [
    ("aten.gelu", torch.nn.functional.gelu), ("aten.sigmoid", torch.sigmoid),
    ("aten.tanh", torch.tanh), ("aten.silu", torch.nn.functional.silu),
    ("aten.hardswish", torch.nn.functional.hardswish),
    ("aten.hardsigmoid", torch.nn.functional.hardsigmoid)])
def test_float_fallback_tables_follow_the_float_function_and_its_gradient(op, torch_fn):
    from ubitrain.niti import tables as fallback
    f, f_exp, d, d_exp = fallback.tables(op)
    for row in (0, 10, 14, 18, len(f_exp) - 1):
        e = fallback.E_LO + row
        x = torch.arange(-128, 128, dtype=torch.float64) * 2.0 ** e
        x.requires_grad_(True)
        y = torch_fn(x)
        y.sum().backward()
        # within one LSB of each table's own exponent (rounding to int8)
        assert np.abs(f[row] * 2.0 ** f_exp[row] - y.detach().numpy()).max() <= 2.0 ** f_exp[row]
        assert np.abs(d[row] * 2.0 ** d_exp[row] - x.grad.numpy()).max() <= 2.0 ** d_exp[row]
    col, row = fallback.table_index(np.array([127, -3]), fallback.E_LO - 2)  # brought up to E_LO
    assert row == 0 and list(col - 128) == [32, -1]
