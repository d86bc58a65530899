"""The optimizer update in the epilogue of a Linear layer's weight-gradient GEMM
(program/update_epilogue.py): bit-identical to the separate update kernels, and like
PyTorch's optimizers (the referee, with its tolerance from PyTorch's own float32 spread:
Adam's m / (sqrt(v) + eps) turns gradients that cancel to near zero over the batch into full
steps, which no fixed tolerance would take). The first layer's gradient (50 rows of 600) is
done 6 rows at a time, so the last block (2 rows) takes the tail kernel."""

import pytest
import torch
from harness import assert_pass_changes_no_bit, require_tools
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


def check(optimizer, target, tmp_path):
    fused, separate = assert_pass_changes_no_bit(model(), data(), optimizer, "update_epilogues",
                                                 tmp_path, target=target)
    for pkg, epilogues in ((fused.package, 2), (separate, 0)):
        kernels = [c.kernel for c in pkg.programs["train_step"].calls]
        assert sum("matmul_update" in k for k in kernels) == epilogues


OPTIMIZERS = {
    "sgd_momentum_nesterov_wd": ub.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": ub.Adam(lr=0.01, betas=(0.5, 0.9), eps=1e-6, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_update_equals_separate_update_and_pytorch(name, tmp_path):
    check(OPTIMIZERS[name], "host", tmp_path)


def test_fused_update_on_aarch64_equals_separate_update_and_pytorch(tmp_path):
    require_tools("aarch64-neon")
    check(ub.SGD(lr=0.05, momentum=0.9), "aarch64-neon", tmp_path)
