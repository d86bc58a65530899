"""The depthwise weight gradient reads x as stored (program/depthwise_input.py): the step is
bit-identical to the transposed copy and the gradient as two kernels, like PyTorch, without
a transpose call and with an arena no larger. One depthwise conv of stride 1 (the direct
run), one of stride 2 (direct loops over phase planes)."""

import numpy as np
import torch
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


def train(as_stored, out_dir):
    batches = data()
    torch.manual_seed(0)
    pkg = ub.compile(Net(), (batches[0][0],), batches[0][1],
                     optimizer=ub.SGD(lr=0.1, momentum=0.9), out_dir=out_dir,
                     disable_passes=() if as_stored else ("depthwise_inputs_in_place",))
    trainer = pkg.build()
    losses = [trainer.step(x.numpy(), y.numpy()) for x, y in batches]
    calls = pkg.programs["train_step"].calls
    return calls, pkg.memory_plan.arena_bytes, losses, trainer.parameters()


def transposes(calls) -> int:
    return sum("transpose" in c.kernel and len(c.args[0].shape) == 5 for c in calls)


def test_depthwise_weight_gradient_reading_x_as_stored_is_bit_identical(tmp_path):
    calls, arena, losses, params = train(True, tmp_path / "stored")
    copied_calls, copied_arena, copied_losses, copied = train(False, tmp_path / "copied")
    assert transposes(copied_calls) == 2 and transposes(calls) == 0
    assert len(calls) == len(copied_calls) - 2
    assert arena <= copied_arena
    assert losses == copied_losses
    for name, value in params.items():
        assert np.array_equal(value, copied[name]), name

    torch.manual_seed(0)
    m = Net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for x, y in data():
        opt.zero_grad()
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    for name, value in m.state_dict().items():
        torch.testing.assert_close(torch.from_numpy(params[name]), value, rtol=1e-5, atol=1e-5)
