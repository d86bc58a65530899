"""The integer BatchNorm's rules (niti/batch_norm.py) against PyTorch's BatchNorm in float64
on the values the integers stand for: each result within the rounding the integer form
allows (the last bit of its own, and the floor of the square root), on random int8
activations over many shapes, exponents and spreads."""

import numpy as np
import torch
import torch.nn.functional as F

from ubitrain.niti import batch_norm as bn

TRIALS = 60


def _activations(rng):
    """int8 values [B, C, H, W] (or [B, C]) at an exponent, some channels constant."""
    shape = [int(rng.integers(1, 9)), int(rng.integers(1, 6))]
    if rng.random() < 0.7:
        shape += [int(rng.integers(1, 7)), int(rng.integers(1, 7))]
    spread = int(rng.integers(1, 128))
    q = rng.integers(-spread, spread + 1, shape)
    if rng.random() < 0.2:
        q[:, 0] = rng.integers(-127, 128)  # a constant channel: variance 0
    return q.astype(np.int8), int(rng.integers(-12, 3))


def _float(q, e):
    return torch.from_numpy(q.astype(np.float64) * 2.0 ** e)


def test_normalize_is_pytorchs_batch_norm_within_its_rounding():
    rng = np.random.default_rng(0)
    for _ in range(TRIALS):
        q, e = _activations(rng)
        x_hat, (r, _) = bn.normalize(q)
        if q.size == q.shape[1]:  # one value per channel: PyTorch refuses; ours gives 0
            assert (x_hat == 0).all()
            continue
        want = F.batch_norm(_float(q, e), None, None, training=True, eps=1e-300)
        want = want.numpy() * 2.0 ** bn.F
        constant = (r == 0).reshape([1, -1] + [1] * (q.ndim - 2))  # float's mean is not
        assert (x_hat[np.broadcast_to(constant, q.shape)] == 0).all()  # exact: no reference
        unclipped = (np.abs(want) < 127) & ~constant
        per_channel = np.maximum(r, 1).reshape([1, -1] + [1] * (q.ndim - 2))
        allowed = 0.5 + np.abs(want) / per_channel + 1e-9  # round, and isqrt's floor
        assert (np.abs(x_hat - want) <= allowed)[unclipped].all()
        assert (np.abs(x_hat[~unclipped & ~constant]) == 127).all()


def test_backward_is_autograds_within_the_rounding_of_x_hat():
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(TRIALS):
        q, e = _activations(rng)
        if q.size == q.shape[1]:
            continue
        x_hat, (r, g) = bn.normalize(q)
        d_hat = rng.integers(-127, 128, q.shape).astype(np.int8)
        e_hat = int(rng.integers(-10, 0))
        dx, e_dx = bn.normalize_backward(d_hat, x_hat, (r, g), e, e_hat)
        x = _float(q, e).requires_grad_(True)
        y = F.batch_norm(x, None, None, training=True, eps=1e-300)
        y.backward(_float(d_hat, e_hat))
        want = x.grad.numpy() * 2.0 ** -e_dx
        n = q.size // q.shape[1]
        for c in np.flatnonzero(r > 0):  # a constant channel has no gradient in either
            # x_hat's rounding (2^-F / 2 per element) in x_hat sum(dx_hat x_hat): at most
            # 2^-F / 2 127 n (1 + max |x_hat|) over r, in units of 2^(2F); the final
            # rounding; isqrt's floor (relative 1 / r)
            top = np.abs(x_hat[:, c]).max() * 2.0 ** -bn.F + 2.0 ** -bn.F
            root = r[c] * 2.0 ** -g[c]  # n sigma in int8 units
            bound = (0.5 + 2.0 ** bn.F / 2 * 127 * n * (1 + top) / root
                     + 3 * np.abs(want[:, c]).max() / r[c])
            assert np.abs(dx[:, c] - want[:, c]).max() <= bound
            checked += 1
    assert checked > TRIALS


def test_running_statistics_move_as_pytorchs():
    rng = np.random.default_rng(2)
    for _ in range(TRIALS):
        q, e = _activations(rng)
        channels = q.shape[1]
        e_mean, e_var = e - 8, 2 * e - 8
        mean0 = rng.integers(-2000, 2000, channels)
        var0 = rng.integers(0, 2**20, channels)
        mean, var = bn.update_running(mean0, var0, e_mean, e_var, q, e, 0.1)
        torch_mean = torch.from_numpy(mean0 * 2.0 ** e_mean)
        torch_var = torch.from_numpy(var0 * 2.0 ** e_var)
        F.batch_norm(_float(q, e), torch_mean, torch_var, training=True, momentum=0.1)
        # two roundings (the batch statistic to its exponent, the moved value) and the
        # momentum in fixed point: 6554 / 2^16 against 0.1
        m_error = abs(round(0.1 * 2**bn.MOMENTUM_BITS) / 2**bn.MOMENTUM_BITS - 0.1)
        for got, old, want in ((mean, mean0, torch_mean.numpy() * 2.0 ** -e_mean),
                               (var, var0, torch_var.numpy() * 2.0 ** -e_var)):
            if np.isnan(want).any():  # PyTorch's unbiased variance of one value
                continue
            batch = old + (want - old) / 0.1
            assert (np.abs(got - want) <= 1.0 + np.abs(batch - old) * m_error + 1e-6).all()


def test_evaluation_uses_the_running_statistics_as_pytorch():
    rng = np.random.default_rng(3)
    for _ in range(TRIALS):
        q, e = _activations(rng)
        channels = q.shape[1]
        e_mean, e_var = e - 8, 2 * e - 8
        mean = rng.integers(-2000, 2000, channels)
        var = rng.integers(2**14, 2**20, channels)
        x_hat = bn.normalize_running(q, e, mean, var, e_mean, e_var)
        want = F.batch_norm(_float(q, e), torch.from_numpy(mean * 2.0 ** e_mean),
                            torch.from_numpy(var * 2.0 ** e_var), training=False, eps=1e-300)
        want = want.numpy() * 2.0 ** bn.F
        sigma = np.sqrt(var * 2.0 ** (e_var - 2 * min(e, e_mean)))
        allowed = 0.5 + np.abs(want) / np.floor(sigma).reshape([1, -1] + [1] * (q.ndim - 2))
        unclipped = np.abs(want) < 127
        assert (np.abs(x_hat - want) <= allowed + 1e-9)[unclipped].all()
