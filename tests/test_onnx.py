"""ONNX in: models exported from PyTorch train through the C like the PyTorch module does."""

import copy

import numpy as np
import onnx
import pytest
import torch
from harness import (
    assert_trains_like_torch,
    batches,
    rel_err,
    torch_steps_with_frozen_rows,
    zoo_case,
)
from torch import nn

import ubitrain as ub
from ubitrain.zoo import ZOO

STEPS = 5


def export(model, example, path):
    """Export a copy in training mode and give `model` the exported state: tracing in
    training mode runs one forward pass, which moves the copy's BatchNorm statistics."""
    torch.onnx.export(copy.deepcopy(model), (example,), str(path), dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    exported = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
                for t in onnx.load(str(path)).graph.initializer}
    model.load_state_dict(exported, strict=False)
    return path


def without_batch_counters(model):
    """`model` without BatchNorm's num_batches_tracked, which ONNX does not carry (nor does
    the C compiled from it): a counter that only a BatchNorm of momentum=None reads."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            assert m.momentum is not None
            m.num_batches_tracked = None
    return model


class ConvSequence(nn.Module):
    """Conv1d, BatchNorm1d, GELU, view(size(0), -1): the exporter's shape arithmetic."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.act = nn.GELU()
        self.fc = nn.Linear(4 * 6, 5)

    def forward(self, x):
        y = self.act(self.bn(self.conv(x)))
        return self.fc(y.view(y.size(0), -1))


class ElementwiseMath(nn.Module):
    """Exp, Log, Sqrt, Abs, Reciprocal and Pow with a constant exponent between two layers."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = self.fc1(x)
        h = torch.exp(torch.tanh(h)) + torch.log(h * h + 0.5) + torch.sqrt(h.abs() + 0.1)
        return self.fc2(torch.reciprocal(h.abs() + 1.0) + (h * h + 0.1) ** 1.5)


CASES = {
    "digits_cnn": (ZOO["digits_cnn"].factory, (1, 8, 8), 10),
    "mlp_layernorm_gelu": (ZOO["mlp_layernorm_gelu"].factory, (32,), 10),
    "resnet_small": (ZOO["resnet_small"].factory, (3, 16, 16), 10),
    "conv_sequence": (ConvSequence, (3, 6), 5),
    "elementwise_math": (ElementwiseMath, (6,), 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_onnx_model_trains_like_pytorch(case, tmp_path):
    factory, shape, classes = CASES[case]
    torch.manual_seed(1)
    model = factory().train()
    data = batches((4, *shape), classes, STEPS, seed=1)
    path = export(model, data[0][0], tmp_path / f"{case}.onnx")
    judged = assert_trains_like_torch(without_batch_counters(model), data,
                                      ub.SGD(lr=0.01, momentum=0.9), tmp_path / case,
                                      compiled=path)
    assert judged.parameters.keys() == model.state_dict().keys()


def test_onnx_model_trains_a_fraction_of_channels(tmp_path):
    """The channel split is a Relax rewrite, so it applies to ONNX's Conv and Gemm too."""
    model, data = zoo_case("digits_cnn", 4, 3)
    path = export(model, data[0][0], tmp_path / "digits.onnx")
    rows = {"features.4.weight": 4, "classifier.weight": 5}  # a quarter of 16, half of 10
    rule = ub.SparseUpdate(channels={"features.4": 0.25, "classifier": 0.5})
    pkg = ub.compile(path, data[0][:1], data[0][1], trainable=rule,
                     optimizer=ub.SGD(lr=0.05), out_dir=tmp_path / "channels")
    assert pkg.trainable == ["features.4.weight[0:4]", "classifier.weight[0:5]"]
    want_losses, want = torch_steps_with_frozen_rows(
        model, data, lambda ps: torch.optim.SGD(ps, lr=0.05), rows)
    trainer = pkg.build()
    for got, expected in zip(trainer.train(data), want_losses, strict=True):
        assert rel_err(got, expected) <= 1e-4
    params = trainer.parameters()
    for name, value in want.items():
        if "num_batches_tracked" not in name:
            assert rel_err(params[name], value) <= 1e-4, name
    initial = model.state_dict()
    for name, n in rows.items():
        assert np.array_equal(params[name][n:], initial[name][n:].numpy()), name


def test_unsupported_onnx_node_is_named(tmp_path):
    model = nn.Sequential(nn.Linear(4, 4), nn.ELU(), nn.Linear(4, 2))
    x, y = torch.randn(2, 4), torch.tensor([0, 1])
    path = export(model, x, tmp_path / "elu.onnx")
    with pytest.raises(ub.UnsupportedOpError, match=r"node '.*': ONNX op Elu is not supported"):
        ub.compile(path, (x,), y, out_dir=tmp_path / "m")


def test_unreadable_onnx_file(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ub.CompileError, match="cannot read the ONNX model"):
        ub.compile(bad, (torch.zeros(1, 2),), torch.tensor([0]), out_dir=tmp_path / "m")


def test_cli_compiles_an_onnx_file(tmp_path):
    import subprocess

    torch.manual_seed(0)
    model = ZOO["digits_cnn"].factory().train()
    path = export(model, torch.randn(8, 1, 8, 8), tmp_path / "digits.onnx")
    run = subprocess.run(["ubitrain", "compile", str(path), "--out-dir", str(tmp_path / "out")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "compiled digits.onnx" in run.stdout and "batch 8" in run.stdout
    assert (tmp_path / "out" / "model.c").exists()
