"""In-place Dropout and torchvision's StochasticDepth train through the generated C as in
PyTorch: their masks come from the C runtime's seeded generator, and the referee
(harness.assert_trains_like_torch, float64) replays those draws inside PyTorch's own Dropout and
stochastic_depth code. Plain Dropout's tests are in test_ops_dropout.py."""

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import assert_trains_like_torch, batches
from torch import nn

import ubitrain as ub
from tools.real_models import torchvision_ops
from ubitrain.errors import UbitrainWarning
from ubitrain.fidelity.dropout import bernoulli_mask, dropout_mask
from ubitrain.fidelity.referee import referee
from ubitrain.fidelity.reference import Reference


class Regularised(nn.Module):
    """Every kind of random mask, in place and not, around a residual StochasticDepth."""

    def __init__(self, mode: str):
        super().__init__()
        self.fc1, self.fc2, self.out = nn.Linear(6, 16), nn.Linear(16, 16), nn.Linear(16, 5)
        self.drop = nn.Dropout(0.3, inplace=True)
        self.depth = torchvision_ops().StochasticDepth(0.5, mode)

    def forward(self, x):
        # in place only on Linear outputs: PyTorch's backward needs tanh's output unchanged
        h = torch.tanh(self.drop(self.fc1(x)))
        if self.training:  # the functional form, on a tensor whose values it ignores
            h = h * torch.bernoulli(torch.zeros_like(h), 0.8)
        g = F.dropout(self.fc2(h), 0.2, training=self.training, inplace=True)
        g = F.dropout(torch.tanh(g), 0.25, training=self.training)
        return self.out(self.depth(g) + h)


@pytest.mark.parametrize("mode", ["row", "batch"])
@pytest.mark.parametrize("batch", [1, 8])
def test_inplace_dropout_and_stochastic_depth_train_like_pytorch(mode, batch, tmp_path):
    torch.manual_seed(0)
    assert_trains_like_torch(Regularised(mode), batches((batch, 6), 5, seed=batch),
                             ub.SGD(lr=0.1, momentum=0.9), tmp_path, seed=5)


class ChannelAndAlphaDropout(nn.Module):
    """Dropout2d (one draw per channel) and AlphaDropout decompose into bernoulli_ too."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(2, 4, 3, padding=1), nn.Linear(4 * 5 * 5, 3)
        self.drop2d, self.alpha = nn.Dropout2d(0.4), nn.AlphaDropout(0.3)

    def forward(self, x):
        return self.fc(self.alpha(self.drop2d(torch.tanh(self.conv(x))).flatten(1)))


def test_channel_and_alpha_dropout_train_like_pytorch(tmp_path):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 2, 5, 5, generator=gen), torch.randint(0, 3, (8,), generator=gen))
               for _ in range(3)]
    assert_trains_like_torch(ChannelAndAlphaDropout(), batches, ub.SGD(lr=0.1, momentum=0.9),
                             tmp_path, seed=2)


def test_the_referee_tells_other_masks_apart(tmp_path):
    """The C built with one seed, judged as if it had another: the masks differ, so the
    steps must too (the match above is not the masks' doing nothing)."""
    torch.manual_seed(0)
    model, data = Regularised("row"), batches((8, 6), 5, seed=8)
    pkg = ub.compile(model, (data[0][0],), data[0][1], optimizer=ub.SGD(lr=0.1),
                     out_dir=tmp_path)
    trainer = pkg.build(seed=5)
    verdict = referee(trainer, Reference(model, ub.SGD(lr=0.1), "cross_entropy",
                                         pkg.trainable), data, seed=6)
    assert verdict.status == "mismatch"


def test_bernoulli_masks_are_the_c_draws_of_keep():
    """bernoulli_(keep) draws as Dropout(1 - keep) does, with 1 for the kept elements."""
    keep, shape = 0.7, (64, 32)
    mask, state = bernoulli_mask(11, shape, keep)
    dropped, after = dropout_mask(11, shape, 1.0 - keep)
    assert state == after
    np.testing.assert_array_equal(mask, (dropped != 0).astype(np.float32))
    assert set(np.unique(mask)) == {0.0, 1.0}
    assert abs(mask.mean() - keep) < 0.03  # 2048 draws: about 3 standard deviations


def test_stochastic_depth_one_draw_per_sample_or_per_batch(tmp_path):
    """Row mode draws one number per sample, batch mode one per step: the C's program."""
    for mode, draws in (("row", 8), ("batch", 1)):
        model = nn.Sequential(nn.Linear(6, 6), torchvision_ops().StochasticDepth(0.5, mode))
        pkg = ub.compile(model, (torch.randn(8, 6),), torch.randint(0, 6, (8,)),
                         out_dir=tmp_path / mode)
        masks = [c.args[0] for c in pkg.programs["train_step"].calls
                 if c.kernel == "ub_dropout_mask"]
        assert [int(np.prod(m.shape)) for m in masks] == [draws]


def test_masks_drawn_in_eval_mode_are_refused(tmp_path):
    class AlwaysDropping(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 5)

        def forward(self, x):
            return F.dropout(self.fc(x), 0.5, training=True)

    with pytest.raises(ub.CompileError, match="training=self.training"):
        ub.compile(AlwaysDropping(), (torch.randn(4, 6),), torch.randint(0, 5, (4,)),
                   out_dir=tmp_path)


def test_micro_batches_warn_of_batch_mode_stochastic_depth(tmp_path):
    model = nn.Sequential(nn.Linear(6, 6))
    model.add_module("depth", torchvision_ops().StochasticDepth(0.5, "batch"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ub.compile(model, (torch.randn(8, 6),), torch.randint(0, 6, (8,)),
                   out_dir=tmp_path, micro_batches=2)
    assert any(issubclass(w.category, UbitrainWarning) and "depth" in str(w.message)
               for w in caught)
