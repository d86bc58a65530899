"""The optimizer update in the epilogue of a Linear layer's weight-gradient GEMM
(program/update_epilogue.py): bit-identical to the separate update kernels, and like
PyTorch's optimizers. The first layer's gradient (50 rows of 600) is done 6 rows at a time,
so the last block (2 rows) takes the tail kernel."""

import numpy as np
import pytest
import torch
from test_targets import require_tools
from torch import nn

import ubitrain as ub

STEPS = 3


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(600, 50), nn.ReLU(), nn.Linear(50, 10))


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 600, generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(STEPS)]


def train(optimizer, fused, target, out_dir):
    batches = data()
    pkg = ub.compile(model(), (batches[0][0],), batches[0][1], optimizer=optimizer,
                     target=target, out_dir=out_dir,
                     disable_passes=() if fused else ("update_epilogues",))
    kernels = [c.kernel for c in pkg.programs["train_step"].calls]
    assert sum("matmul_update" in k for k in kernels) == (2 if fused else 0)
    trainer = pkg.build()
    try:
        losses = [trainer.step(x.numpy(), y.numpy()) for x, y in batches]
        return losses, trainer.parameters(), trainer.optimizer_state()
    finally:
        getattr(trainer, "close", lambda: None)()  # the emulated trainers' process


def pytorch(optimizer_factory):
    m = model()
    opt = optimizer_factory(m.parameters())
    for x, y in data():
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in m.state_dict().items()}


OPTIMIZERS = {
    "sgd_momentum_nesterov_wd": (
        ub.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    # Adam against PyTorch is test_optimizers.py's: here m / (sqrt(v) + eps) turns gradients
    # that cancel to near zero over the batch (their rounding differs between PyTorch's GEMM
    # and ours) into full steps, so only the identity with the separate update is checked.
    "adam": (ub.Adam(lr=0.01, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.1), None),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_update_equals_separate_update_and_pytorch(name, tmp_path):
    optimizer, torch_optimizer = OPTIMIZERS[name]
    fused = train(optimizer, True, "host", tmp_path / "fused")
    separate = train(optimizer, False, "host", tmp_path / "separate")
    assert fused[0] == separate[0]
    for got, want in zip(fused[1:], separate[1:]):
        assert got.keys() == want.keys()
        for key in got:
            assert np.array_equal(got[key], want[key]), key
    if torch_optimizer is None:
        return
    for key, want in pytorch(torch_optimizer).items():
        got = fused[1][key]
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), key


def test_fused_update_on_aarch64_equals_separate_update(tmp_path):
    require_tools("aarch64-neon")
    optimizer = ub.SGD(lr=0.05, momentum=0.9)
    fused = train(optimizer, True, "aarch64-neon", tmp_path / "fused")
    separate = train(optimizer, False, "aarch64-neon", tmp_path / "separate")
    assert fused[0] == separate[0]
    for key in fused[1]:
        assert np.array_equal(fused[1][key], separate[1][key]), key
