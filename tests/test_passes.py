"""Every rewrite pass of the declared pipeline can be switched off by name, and the step then
trains the same: bit for bit for the passes that claim it, within float32 rounding of PyTorch
for the others. A pass whose precondition does not hold on the program does nothing."""

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub
from ubitrain.fidelity.referee import judge
from ubitrain.pipeline import FP32, INT8

BIT_EXACT = FP32.bit_exact
PASSES = [r.name for r in FP32.rewrites]

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
    x, y = torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ub.CompileError, match="unknown pass 'fusion'.*fuse_kernels"):
        ub.compile(EveryPass(), (x,), y, out_dir=tmp_path, disable_passes=("fusion",))
    # int8 runs some of the float pipeline's passes: another one's name is unknown there
    with pytest.raises(ub.CompileError, match="unknown pass 'microkernels' for "
                                              "precision='int8'.*fuse_kernels"):
        ub.compile(EveryPass(), (x,), y, out_dir=tmp_path, precision="int8",
                   disable_passes=("microkernels",))
    assert [r.name for r in INT8.rewrites] == ["fuse_kernels", "early_updates",
                                               "share_in_place", "fold_frozen_calls"]


def test_a_pass_whose_precondition_fails_does_nothing(tmp_path):
    """With micro-batches the calls are a loop body: the passes over neighbouring calls say
    why they did not run, and the step is the one they would have left alone."""
    torch.manual_seed(0)
    batches = data()
    pkg = ub.compile(EveryPass(), (batches[0][0],), batches[0][1], micro_batches=2,
                     optimizer=ub.SGD(lr=0.05), out_dir=tmp_path / "k2")
    for name in ("early_updates", "pool_relu_grads", "bn_activation_grads",
                 "depthwise_inputs_in_place"):
        assert pkg.skipped_passes[name] == "the step runs a micro-batch loop"
    assert pkg.skipped_passes["update_epilogues"] == ("builds on early_updates, which did not "
                                                      "run")
    torch.manual_seed(0)
    off = ub.compile(EveryPass(), (batches[0][0],), batches[0][1], micro_batches=2,
                     optimizer=ub.SGD(lr=0.05), out_dir=tmp_path / "k2",
                     disable_passes=("early_updates", "pool_relu_grads", "bn_activation_grads",
                                     "depthwise_inputs_in_place", "update_epilogues"))
    assert [c.kernel for c in off.programs["train_step"].calls] == \
        [c.kernel for c in pkg.programs["train_step"].calls]


def test_the_cli_and_the_readme_list_the_declared_passes(capsys):
    from pathlib import Path

    from ubitrain.cli import main

    assert main(["passes"]) == 0
    listed = [line.split()[1] for line in capsys.readouterr().out.splitlines()
              if line.lstrip().startswith("*")]
    assert listed == PASSES
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for name in PASSES:
        assert f"`{name}`" in readme, f"the README does not describe the pass {name}"
