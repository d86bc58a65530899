"""The max-pool gradient fused with the ReLU gradient, in place over the ReLU's output
(program/pool_relu.py): bit-identical to the two separate kernels, like PyTorch, and the
ReLU output's buffer is reused (the arena shrinks). Images of 9x9 and 5x5 leave a row and a
column that no 2x2 window covers, whose gradient must be zero; one channel's windows are all
zero (ties, no gradient through the ReLU); an overlapping 3x3 / 2 pool is not fused. The
fused kernel also runs out of place (where x outlives it), a loop of its own."""

import torch
from harness import assert_pass_changes_no_bit, assert_trains_like_torch
from torch import nn

import ubitrain as ub
import ubitrain.program.pool_relu as pool_relu

STEPS = 3


class Net(nn.Module):
    def __init__(self, pool: nn.Module):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 6, 3, padding=1)
        self.pool, self.fc = pool, nn.LazyLinear(5)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


def model(pool):
    torch.manual_seed(0)
    m = Net(pool)
    m(torch.zeros(1, 2, 9, 9))  # materialise the lazy layer
    with torch.no_grad():  # channel 0 of conv1 all below 0: every window's maximum ties at 0
        m.conv1.bias[0] = -100.0
    return m


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 2, 9, 9, generator=g), torch.randint(0, 5, (4,), generator=g))
            for _ in range(STEPS)]


def fused_calls(pkg):
    return [c for c in pkg.programs["train_step"].calls if "max_pool2d_backward_relu" in c.kernel]


def test_fused_pool_relu_gradient_is_bit_identical_in_place_and_like_pytorch(tmp_path):
    fused, apart = assert_pass_changes_no_bit(model(nn.MaxPool2d(2)), data(),
                                              ub.SGD(lr=0.1, momentum=0.9), "pool_relu_grads",
                                              tmp_path)
    calls = fused_calls(fused.package)
    assert len(calls) == 2
    assert all(c.args[2].root is c.args[1].root for c in calls)  # dz over x: in place
    assert fused.package.memory_plan.arena_bytes < apart.memory_plan.arena_bytes


def test_fused_pool_relu_gradient_out_of_place_is_bit_identical(tmp_path, monkeypatch):
    # dz gets its own buffer
    monkeypatch.setattr(pool_relu, "take_dying_buffer", lambda *args: None)
    fused, _ = assert_pass_changes_no_bit(model(nn.MaxPool2d(2)), data(),
                                          ub.SGD(lr=0.1, momentum=0.9), "pool_relu_grads",
                                          tmp_path)
    calls = fused_calls(fused.package)
    assert len(calls) == 2 and all(c.args[2].root is not c.args[1].root for c in calls)


def test_overlapping_windows_are_not_fused(tmp_path):
    judged = assert_trains_like_torch(model(nn.MaxPool2d(3, stride=2)), data(),
                                      ub.SGD(lr=0.1, momentum=0.9), tmp_path)
    kernels = [c.kernel for c in judged.package.programs["train_step"].calls]
    assert not any("max_pool2d_backward_relu" in k for k in kernels)
    assert any("max_pool2d_backward" in k for k in kernels)
