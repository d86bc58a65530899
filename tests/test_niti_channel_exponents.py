"""niti/channel_exponents.py against float64 arithmetic: per-channel int8 weights, the
accumulator brought to one exponent, the weight at one exponent for the backward, and the
update that moves every channel by the per-tensor update's value."""

import numpy as np
import pytest

from ubitrain.niti import channel_exponents as ce
from ubitrain.niti.update import niti_update


def _folded_like(rng, channels=16, spread=2.0**8):
    """A conv weight whose channels differ in scale as folding BatchNorm makes them."""
    scales = np.exp2(rng.uniform(0, np.log2(spread), channels))
    return (rng.standard_normal((channels, 3, 3, 3)) * scales[:, None, None, None]
            ).astype(np.float32)


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def test_each_channel_is_within_half_its_own_lsb_where_one_tensor_exponent_loses_it():
    rng = np.random.default_rng(0)
    w = _folded_like(rng)
    w[3] = 0.0  # an all-zero channel does not set the coarsest exponent
    q, e = ce.quantize_channels(w)
    assert q.dtype == np.int8 and e.shape == (16,)
    value = q.astype(np.float64) * np.exp2(e.astype(np.float64))[:, None, None, None]
    lsb = np.exp2(e.astype(np.float64))[:, None, None, None]
    assert np.all(np.abs(value - w) <= lsb / 2)
    tops = np.abs(q.astype(np.int64)).reshape(16, -1).max(1)
    assert np.all(tops[w.reshape(16, -1).any(1)] >= 64) and np.all(tops <= 127)
    assert e[3] == max(e[i] for i in range(16) if i != 3)
    # one exponent for the tensor: the smallest channels keep almost nothing
    at_one, _ = ce.weight_at_coarsest(q, e)
    small = int(np.argmin(np.abs(w).reshape(16, -1).max(1)[np.arange(16) != 3]))
    assert np.abs(at_one[small if small < 3 else small + 1].astype(np.int64)).max() < 8


@pytest.mark.parametrize("axis", [1, 0])
def test_the_accumulator_at_the_coarsest_exponent_is_its_value_rounded_half_away(axis):
    rng = np.random.default_rng(1)
    total = rng.integers(-2**30, 2**30, (4, 6, 5) if axis == 1 else (6, 7))
    e = rng.integers(-20, -4, 6).astype(np.int32)
    got, coarsest = ce.to_coarsest(total, e, axis)
    assert coarsest == e.max()
    shape = [1] * total.ndim
    shape[axis] = -1
    exact = total.astype(np.float64) * np.exp2((e - coarsest).astype(np.float64)).reshape(shape)
    assert np.array_equal(got, _round_half_away(exact).astype(np.int64))


def test_the_update_moves_each_channel_by_the_per_tensor_updates_value():
    rng = np.random.default_rng(2)
    q, e = ce.quantize_channels(_folded_like(rng, spread=2.0**10))
    grad = rng.integers(-2**20, 2**20, q.shape)
    mu = 5
    new = ce.update(q, grad, e, mu)
    s = int(np.max([0, int(np.abs(grad).max()).bit_length() - mu]))
    # in channel c's own LSBs, the per-tensor step G 2^-s (in units of 2^E) is G 2^(E-e-s)
    wanted = grad * np.exp2((e.max() - e - s).astype(np.float64))[:, None, None, None]
    step = q.astype(np.int64) - new.astype(np.int64)
    free = (np.abs(wanted) < 127) & (np.abs(q.astype(np.int64) - wanted) < 127)
    assert free.sum() > q.size // 4, "the check would pass on clipped steps alone"
    assert np.all(np.abs(step - wanted)[free] < 1)  # PstoShift: within one of its LSBs


def test_with_one_exponent_every_channel_it_is_nitis_per_tensor_update():
    rng = np.random.default_rng(3)
    q = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    grad = rng.integers(-2**18, 2**18, q.shape)
    e = np.full(8, -7, np.int32)
    assert np.array_equal(ce.update(q, grad, e, 4), niti_update(q, grad, 4).astype(np.int8))
