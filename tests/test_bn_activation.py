"""BatchNorm's backward with the ReLU6 / ReLU gradient mask after it taken in
(program/bn_activation.py): the step is bit-identical to the mask and the backward as two
kernels, like PyTorch, with two kernel calls fewer and dx still over x in place. Planes of
6x6 leave a tail after the vector lanes; round inputs put values of z on the clamp's edges."""

import torch
from harness import assert_pass_changes_no_bit
from torch import nn

import ubitrain as ub

STEPS = 3


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 6, 1), nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        x = nn.functional.relu6(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(self.bn3(self.conv3(x)).mean((2, 3)))


def data():
    g = torch.Generator().manual_seed(1)
    return [(torch.round(4 * torch.randn(4, 3, 6, 6, generator=g)),
             torch.randint(0, 5, (4,), generator=g)) for _ in range(STEPS)]


def test_masked_batch_norm_backward_is_bit_identical_and_like_pytorch(tmp_path):
    torch.manual_seed(0)
    fused, apart = assert_pass_changes_no_bit(Net(), data(), ub.SGD(lr=0.1, momentum=0.9),
                                              "bn_activation_grads", tmp_path)
    calls = fused.package.programs["train_step"].calls
    apart_calls = apart.programs["train_step"].calls
    kernels = [c.kernel for c in calls]
    assert sum("batch_norm_clip_backward" in k for k in kernels) == 1
    assert sum("batch_norm_relu_backward" in k for k in kernels) == 1
    assert len(calls) == len(apart_calls) - 2
    for c in calls:
        if "batch_norm_clip_backward" in c.kernel or "batch_norm_relu_backward" in c.kernel:
            assert c.args[6].root is c.args[0].root  # dx over x, in place
