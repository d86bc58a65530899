"""Every rewrite pass can be switched off by name, and the step then trains the same: bit for bit
for the passes that claim it, within float32 rounding of PyTorch for the others."""

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub
from ubitrain.fidelity.referee import judge
from ubitrain.program.passes import BIT_EXACT, PASSES

STEPS = 2


class EveryPass(nn.Module):
    """Conv-BN-ReLU-max-pool (BatchNorm's masked backward, the fused pool/ReLU gradient), a
    depthwise conv (its weight gradient reading x as stored), Linear layers (weight
    transposes folded, the update in the GEMM's epilogue) and fused elementwise chains."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc1 = nn.Linear(8 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        x = nn.functional.gelu(self.dw(x)) * 0.5 + x
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


def data():
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))
            for _ in range(STEPS)]


def train(out_dir, disabled=()):
    torch.manual_seed(0)
    batches = data()
    pkg = ub.compile(EveryPass(), (batches[0][0],), batches[0][1],
                     optimizer=ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
                     out_dir=out_dir, disable_passes=disabled)
    trainer = pkg.build()
    losses = [trainer.step(x, y) for x, y in batches]
    source = (pkg.out_dir / "model.c").read_text()
    return source, losses, trainer.parameters(), trainer.predict(batches[-1][0])


@pytest.fixture(scope="module")
def all_on(tmp_path_factory):
    return train(tmp_path_factory.mktemp("all_on"))


@pytest.mark.parametrize("name", [p for p in BIT_EXACT if p != "fold_frozen_calls"])
def test_bit_exact_pass_switched_off(name, all_on, tmp_path):
    source, losses, params, output = train(tmp_path, (name,))
    assert source != all_on[0], f"switching {name} off changed nothing in model.c"
    assert np.array_equal(losses, all_on[1])
    for key, value in params.items():
        assert value.tobytes() == all_on[2][key].tobytes(), key
    assert output.tobytes() == all_on[3].tobytes()


@pytest.mark.parametrize("name", ["microkernels", "fold_weight_transposes"])
def test_other_passes_switched_off_still_train_like_pytorch(name, tmp_path):
    torch.manual_seed(0)
    verdict = judge(EveryPass(), data(), ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
                    tmp_path, disable_passes=(name,))
    assert verdict.status == "match", verdict.summary()


def test_every_pass_is_named_and_unknown_names_are_refused(tmp_path):
    assert set(BIT_EXACT) < set(PASSES)
    with pytest.raises(ub.CompileError, match="unknown pass 'fusion'.*fuse_kernels"):
        ub.compile(EveryPass(), (torch.zeros(4, 3, 8, 8),), torch.zeros(4, dtype=torch.long),
                   out_dir=tmp_path, disable_passes=("fusion",))
