"""ONNX in: models exported from PyTorch train through the C like the PyTorch module does."""

import copy

import numpy as np
import onnx
import pytest
import torch
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


def relative_error(actual, expected) -> float:
    expected = np.asarray(expected, np.float64)
    return float(np.abs(np.asarray(actual, np.float64) - expected).max()
                 / max(np.abs(expected).max(), 1e-30))


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
    batches = [(torch.randn(4, *shape), torch.randint(0, classes, (4,))) for _ in range(STEPS)]
    path = export(model, batches[0][0], tmp_path / f"{case}.onnx")
    pkg = ub.compile(path, batches[0][:1], batches[0][1], optimizer=ub.SGD(lr=0.01, momentum=0.9),
                     out_dir=tmp_path / case)
    trainer = pkg.build()
    reference = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for x, y in batches:
        loss = trainer.step(x, y)
        reference.zero_grad()
        expected = nn.functional.cross_entropy(model(x), y)
        expected.backward()
        reference.step()
        assert relative_error(loss, expected.item()) <= 1e-4
    params = trainer.parameters()
    state = {k: v for k, v in model.state_dict().items() if "num_batches_tracked" not in k}
    assert set(params) == set(state)  # ONNX carries no num_batches_tracked
    for name, value in state.items():
        assert relative_error(params[name], value.numpy()) <= 1e-4, name


def test_onnx_model_trains_a_fraction_of_channels(tmp_path):
    """The channel split is a Relax rewrite, so it applies to ONNX's Conv and Gemm too."""
    torch.manual_seed(1)
    model = ZOO["digits_cnn"].factory().train()
    batches = [(torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))) for _ in range(3)]
    path = export(model, batches[0][0], tmp_path / "digits.onnx")
    rows = {"features.4.weight": 4, "classifier.weight": 5}  # a quarter of 16, half of 10
    rule = ub.SparseUpdate(channels={"features.4": 0.25, "classifier": 0.5})
    pkg = ub.compile(path, batches[0][:1], batches[0][1], trainable=rule,
                     optimizer=ub.SGD(lr=0.05), out_dir=tmp_path / "channels")
    assert pkg.trainable == ["features.4.weight[0:4]", "classifier.weight[0:5]"]
    trainer = pkg.build()
    initial = copy.deepcopy(model.state_dict())
    reference = torch.optim.SGD([model.get_parameter(n) for n in rows], lr=0.05)
    for x, y in batches:
        loss = trainer.step(x, y)
        reference.zero_grad()
        expected = nn.functional.cross_entropy(model(x), y)
        expected.backward()
        reference.step()
        with torch.no_grad():  # the frozen rows back as they were
            for name, n in rows.items():
                model.get_parameter(name)[n:] = initial[name][n:]
        assert relative_error(loss, expected.item()) <= 1e-4
    params = trainer.parameters()
    for name, value in model.state_dict().items():
        if "num_batches_tracked" not in name:
            assert relative_error(params[name], value.numpy()) <= 1e-4, name
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
