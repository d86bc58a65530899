"""The depthwise weight gradient reads x as stored (program/depthwise_input.py): the step is
bit-identical to the transposed copy and the gradient as two kernels, like PyTorch, without
a transpose call and with an arena no larger. One depthwise conv of stride 1 (the direct
run), one of stride 2 (direct loops over phase planes)."""

import torch
from harness import assert_pass_changes_no_bit
from torch import nn

import ubitrain as ub

STEPS = 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 1)
        self.dw1 = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.dw2 = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x = self.dw2(torch.relu(self.dw1(torch.relu(self.conv(x)))))
        return self.fc(x.mean((2, 3)))


def data():
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(3, 3, 10, 10, generator=g), torch.randint(0, 4, (3,), generator=g))
            for _ in range(STEPS)]


def transposes(calls) -> int:
    return sum("transpose" in c.kernel and len(c.args[0].shape) == 5 for c in calls)


def test_depthwise_weight_gradient_reading_x_as_stored_is_bit_identical(tmp_path):
    torch.manual_seed(0)
    stored, copied = assert_pass_changes_no_bit(Net(), data(), ub.SGD(lr=0.1, momentum=0.9),
                                                "depthwise_inputs_in_place", tmp_path)
    calls = stored.package.programs["train_step"].calls
    copied_calls = copied.programs["train_step"].calls
    assert transposes(copied_calls) == 2 and transposes(calls) == 0
    assert len(calls) == len(copied_calls) - 2
    assert stored.package.memory_plan.arena_bytes <= copied.memory_plan.arena_bytes
