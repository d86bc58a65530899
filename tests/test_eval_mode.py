"""A model trained in eval mode, whole (`model.eval()`) or in part (BatchNorm modules frozen
in eval mode, as fine-tuning with frozen statistics does), trains as PyTorch trains it in
that mode: an eval-mode BatchNorm normalises with its running statistics in the forward and
the backward (its input gradient is the scale / sqrt(running_var + eps)) and leaves them
alone; an eval-mode Dropout is the identity. Judged by the referee, which runs each module
in the mode it was compiled in."""

import copy

import numpy as np
import pytest
import torch
from harness import assert_trains_like_torch, batches
from torch import nn

import ubitrain as ub

OPTIMIZERS = {"sgd": ub.SGD(lr=0.1, momentum=0.9), "adam": ub.Adam(lr=0.01)}
STATS = ("running_mean", "running_var", "num_batches_tracked")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 6, 3), nn.BatchNorm2d(6)
        self.drop = nn.Dropout(0.4)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(self.drop(x.mean((2, 3))))


def net() -> Net:
    """Running statistics far from a batch's own, as after pretraining on other data: a
    step with batch statistics would differ from one with the running ones."""
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-1.0, 1.0)
            bn.running_var.uniform_(0.3, 3.0)
            bn.num_batches_tracked.fill_(100)
    return model


def data():
    return batches((4, 3, 8, 8), 5, steps=3, seed=2)


def _stats(state: dict, module: str) -> dict:
    return {s: np.asarray(state[f"{module}.{s}"]) for s in STATS}


def _train_mode_first_loss(model, batch) -> float:
    """PyTorch's first loss with every module in training mode (Dropout off, so that the
    BatchNorm statistics alone make the difference)."""
    ref = copy.deepcopy(model).train()
    ref.drop.p = 0.0
    *xs, y = batch
    with torch.no_grad():
        return float(nn.functional.cross_entropy(ref(*xs), y))


def _dropout_masks(judged) -> int:
    return sum(c.kernel == "ub_dropout_mask"
               for c in judged.package.programs["train_step"].calls)


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_model_in_eval_mode_trains_like_torch(opt, tmp_path):
    model = net().eval()
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    judged = assert_trains_like_torch(model, data(), OPTIMIZERS[opt], tmp_path)
    # the running statistics are used (the loss is not the training-mode one)...
    train_loss = _train_mode_first_loss(model, data()[0])
    assert abs(judged.losses[0] - train_loss) > 0.01 * abs(train_loss)
    # ...and left bit for bit as they were, at every step
    for _, state, _ in judged.verdict.trajectory:
        for bn in ("bn1", "bn2"):
            for name, value in _stats(state, bn).items():
                assert np.array_equal(value, initial[f"{bn}.{name}"]), f"{bn}.{name}"
    assert _dropout_masks(judged) == 0  # Dropout in eval mode: the identity, no mask drawn
    assert not model.training and not model.bn1.training  # the caller's modes are kept


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_batch_norm_frozen_in_eval_mode_in_a_training_model(opt, tmp_path):
    """bn1 frozen (eval mode, its scale and shift not trained either), the rest training:
    bn2 uses and updates batch statistics, Dropout draws its masks."""
    model = net().train()
    model.bn1.eval()
    model.bn1.requires_grad_(False)
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    judged = assert_trains_like_torch(model, data(), OPTIMIZERS[opt], tmp_path)
    final = judged.parameters
    for name, value in _stats(final, "bn1").items():
        assert np.array_equal(value, initial[f"bn1.{name}"]), f"bn1.{name}"
    for name in ("bn1.weight", "bn1.bias"):
        assert np.array_equal(final[name], initial[name]), name
    assert not np.array_equal(final["bn2.running_mean"], initial["bn2.running_mean"])
    assert final["bn2.num_batches_tracked"] == initial["bn2.num_batches_tracked"] + 3
    assert _dropout_masks(judged) == 1
    assert model.training and not model.bn1.training and model.bn2.training


def test_running_statistics_stay_bit_identical_over_steps(tmp_path):
    """Many steps of the C alone, a mixed model (bn1 in eval mode): bn1's running statistics
    are the initial bytes after every step, bn2's move."""
    model = net().train()
    model.bn1.eval()
    initial = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    steps = batches((4, 3, 8, 8), 5, steps=6, seed=3)
    *xs, y = steps[0]
    pkg = ub.compile(model, tuple(xs), y, optimizer=ub.Adam(lr=0.05), out_dir=tmp_path)
    trainer = pkg.build()
    for *xs, y in steps:
        trainer.step(*xs, y)
        state = trainer.parameters()
        for name, value in _stats(state, "bn1").items():
            want = initial[f"bn1.{name}"]
            assert value.tobytes() == want.tobytes(), f"bn1.{name}"
    assert not np.array_equal(state["bn2.running_var"], initial["bn2.running_var"])
    assert not np.array_equal(state["bn1.weight"], initial["bn1.weight"])  # it trains


def test_the_command_line_keeps_each_module_mode():
    """`ubitrain compile` with --loss mse runs a factory's module in eval mode to shape the
    labels: it puts back every module's own mode, not the top module's everywhere."""
    from ubitrain.cli.models import model_from_factory

    def factory():
        model = net().train()
        model.bn1.eval()
        return model

    model, _, _ = model_from_factory(factory, "factory", 2, "3,8,8", "mse")
    assert model.training and not model.bn1.training and model.bn2.training
