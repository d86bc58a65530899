"""Dropout in training mode, with the C runtime's masks replayed in PyTorch: the generated C
against PyTorch. In-place Dropout, bernoulli_ masks and StochasticDepth: test_dropout_inplace.py.

Each op case is judged by `op_harness.check` (op_harness.py says how), the steps by the
referee (harness.assert_trains_like_torch).
"""

from __future__ import annotations

import pytest
import torch
from harness import assert_trains_like_torch, rel_err
from op_harness import check, randn, seeded
from torch import nn

import ubitrain as ub
from ubitrain.fidelity.dropout import dropout_masks, splitmix64


class TwoDropouts(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.drop1, self.drop2 = nn.Dropout(p), nn.Dropout(p)

    def forward(self, x):
        return self.drop2(torch.tanh(self.drop1(self.fc(x))))


def test_splitmix64_reference():
    """The numpy generator is SplitMix64 (reference outputs for seed 0 and 1234567)."""
    draws, _ = splitmix64(0, 3)
    assert [int(d) for d in draws] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    draws, _ = splitmix64(1234567, 3)
    assert [int(d) for d in draws] == [6457827717110365317, 3203168211198807973,
                                       9817491932198370423]


@pytest.mark.parametrize("seed", [0, 7])
def test_dropout(seed, tmp_path):
    p = 0.4
    x = randn(4, 6)
    masks = dropout_masks(seed, [(4, 8), (4, 8)], p)
    assert 0 < sum(int((m == 0).sum()) for m in masks) < 64
    check(seeded(TwoDropouts(p)), (x,), tmp_path, seed=seed, dropout_masks=masks)


def test_dropout_masks_redrawn_each_step(tmp_path):
    """The generator's state runs on across steps: step 2 uses the next draws. The referee
    gives PyTorch the masks the C draws from the state it reports before each step; after two
    steps that state is the seed advanced past all four masks."""
    p, seed = 0.4, 3
    x, y = randn(4, 6), randn(4, 8, seed=1)
    judged = assert_trains_like_torch(seeded(TwoDropouts(p)), [(x, y)] * 2, ub.SGD(lr=0.5),
                                      tmp_path, loss="mse", seed=seed)
    _, after_four_masks = splitmix64(seed, 4 * 4 * 8)  # two steps of two (4, 8) masks
    assert judged.trainer.rng_state == after_four_masks


def test_dropout_p0_is_identity(tmp_path):
    res = check(seeded(TwoDropouts(0.0)), (randn(4, 6),), tmp_path)
    assert rel_err(res.got["predict"], res.want["output"]) <= 1e-4
