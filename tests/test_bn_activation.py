"""BatchNorm's backward with the ReLU6 / ReLU gradient mask after it taken in
(program/bn_activation.py): the step is bit-identical to the mask and the backward as two
kernels, like PyTorch, with two kernel calls fewer and dx still over x in place. Planes of
6x6 leave a tail after the vector lanes; round inputs put values of z on the clamp's edges."""

import numpy as np
import torch
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


def train(fused, out_dir):
    batches = data()
    torch.manual_seed(0)
    pkg = ub.compile(Net(), (batches[0][0],), batches[0][1],
                     optimizer=ub.SGD(lr=0.1, momentum=0.9), out_dir=out_dir,
                     disable_passes=() if fused else ("bn_activation_grads",))
    trainer = pkg.build()
    losses = [trainer.step(x.numpy(), y.numpy()) for x, y in batches]
    return pkg.programs["train_step"].calls, losses, trainer.parameters()


def test_masked_batch_norm_backward_is_bit_identical_and_like_pytorch(tmp_path):
    calls, losses, params = train(True, tmp_path / "fused")
    apart_calls, apart_losses, apart = train(False, tmp_path / "apart")
    kernels = [c.kernel for c in calls]
    assert sum("batch_norm_clip_backward" in k for k in kernels) == 1
    assert sum("batch_norm_relu_backward" in k for k in kernels) == 1
    assert len(calls) == len(apart_calls) - 2
    for c in calls:
        if "batch_norm_clip_backward" in c.kernel or "batch_norm_relu_backward" in c.kernel:
            assert c.args[6].root is c.args[0].root  # dx over x, in place
    assert losses == apart_losses
    for name, value in params.items():
        assert np.array_equal(value, apart[name]), name

    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for (x, y), loss in zip(data(), losses):
        opt.zero_grad()
        want = nn.functional.cross_entropy(m(x), y)
        want.backward()
        opt.step()
        assert abs(loss - want.item()) <= 1e-5 * abs(want.item())
    for name, value in m.state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        torch.testing.assert_close(torch.from_numpy(params[name]), value, rtol=1e-5, atol=1e-5)
