"""Dropout in training mode, with the C runtime's masks replayed in PyTorch: the generated C
against PyTorch. In-place Dropout, bernoulli_ masks and StochasticDepth: test_dropout_inplace.py.

Each case is judged by `op_harness.check` (op_harness.py says how).
"""

from __future__ import annotations

import copy

import pytest
import torch
from op_harness import check, randn, reference_dropout, rel_err, seeded
from torch import nn

import ubitrain as ub
from ubitrain.fidelity.dropout import dropout_masks


class TwoDropouts(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.drop1, self.drop2 = nn.Dropout(p), nn.Dropout(p)

    def forward(self, x):
        return self.drop2(torch.tanh(self.drop1(self.fc(x))))


def test_splitmix64_reference():
    """The numpy generator is SplitMix64 (reference outputs for seed 0 and 1234567)."""
    from ubitrain.fidelity.dropout import splitmix64
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
    """The generator's state runs on across steps: step 2 uses the next draws."""
    p, seed = 0.4, 3
    model = seeded(TwoDropouts(p))
    x, y = randn(4, 6), randn(4, 8, seed=1)
    pkg = ub.compile(model, (x,), y, loss="mse", optimizer=ub.SGD(lr=0.5),
                     out_dir=tmp_path / "drop")
    tr = pkg.build(seed=seed)
    ref = copy.deepcopy(model).double()
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    masks = dropout_masks(seed, [(4, 8)] * 4, p)  # step 1: masks 0, 1; step 2: masks 2, 3
    for step in range(2):
        with reference_dropout(masks[2 * step:2 * step + 2]):
            loss = torch.mean((ref(x.double()) - y.double()) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert rel_err(tr.step(x, y), loss.item()) <= 1e-4
    got = tr.parameters()
    for name, value in ref.state_dict().items():
        assert rel_err(got[name], value.numpy()) <= 1e-4, name


def test_dropout_p0_is_identity(tmp_path):
    res = check(seeded(TwoDropouts(0.0)), (randn(4, 6),), tmp_path)
    assert rel_err(res.got["predict"], res.want["output"]) <= 1e-4
