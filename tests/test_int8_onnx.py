"""precision="int8" from an ONNX file: the generated C trains bit for bit like the build of
the PyTorch module it was exported from, which trains like NITI's numpy reference."""

import numpy as np
import torch
from niti_harness import check_against_reference, niti_batches
from torch import nn

import ubitrain as ub


class ViewNet(nn.Module):
    """Flattened with x.view(x.size(0), -1): Shape / Gather / Concat / Reshape in ONNX."""

    def __init__(self, conv_bias=False):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=conv_bias), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(4, 8, 3, stride=2, padding=1,
                                                                 bias=False), nn.ReLU())
        self.fc = nn.Linear(32, 5, bias=False)

    def forward(self, x):
        x = self.features(x)
        return self.fc(x.view(x.size(0), -1))


def export(model, x, path):
    torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"])
    return path


def test_onnx_int8_trains_like_the_module_and_the_reference(tmp_path):
    data = niti_batches(6)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    config = ub.NITI(mu=(5, 3), milestones=(3,), adaptive_rescale=True, max_interval=4)
    model = ViewNet()
    path = export(model, x, tmp_path / "net.onnx")
    from_onnx = ub.compile(path, (x,), y, precision="int8", optimizer=config,
                           out_dir=tmp_path / "onnx")
    from_module = ub.compile(model, (x,), y, precision="int8", optimizer=config,
                             out_dir=tmp_path / "module")
    check_against_reference(from_module, model, data, config)
    with from_onnx.build() as a, from_module.build() as b:
        for xb, yb in data:
            assert a.step(xb, yb) == b.step(xb, yb)
        got, want = a.int8_parameters(), b.int8_parameters()
        assert np.array_equal(a.predict(data[0][0]), b.predict(data[0][0]))
    for name in ("features.0.weight", "features.3.weight"):
        assert np.array_equal(got[name], want[name])
    (matmul,) = [k for k in got if k.startswith("onnx::MatMul") and "exponent" not in k]
    assert np.array_equal(got[matmul], want["fc.weight"].T)  # Linear(bias=False): [in, out]


def test_onnx_biases_train_like_the_module(tmp_path):
    """A bias's integer scale comes from its layer's input on the example batch: onnx's
    reference evaluator gives the same as the module's forward, so the two builds agree."""
    data = niti_batches(3)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    config = ub.NITI(mu=(5,), milestones=())
    model = ViewNet(conv_bias=True)
    path = export(model, x, tmp_path / "bias.onnx")
    from_onnx = ub.compile(path, (x,), y, precision="int8", optimizer=config,
                           out_dir=tmp_path / "onnx")
    from_module = ub.compile(model, (x,), y, precision="int8", optimizer=config,
                             out_dir=tmp_path / "module")
    with from_onnx.build() as a, from_module.build() as b:
        start = b.int8_parameters()
        assert np.array_equal(a.int8_parameters()["features.0.bias.exponent"],
                              start["features.0.bias.exponent"])
        for xb, yb in data:
            assert a.step(xb, yb) == b.step(xb, yb)
        got, want = a.int8_parameters(), b.int8_parameters()
    assert want["features.0.bias"].dtype == np.int32
    assert np.array_equal(got["features.0.bias"], want["features.0.bias"])
    assert not np.array_equal(want["features.0.bias"], start["features.0.bias"])  # it trained


def test_onnx_table_functions_train_like_the_module(tmp_path):
    """Sigmoid, Tanh, HardSwish and Gelu nodes of an ONNX file become the int8 pipeline's
    tables (niti/tables.py) as the module's ATen ops do: the two builds agree bit for bit."""
    data = niti_batches(3)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    config = ub.NITI(mu=(5,), milestones=())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.Hardswish(),
                          nn.Conv2d(4, 4, 3, stride=2, padding=1, bias=False), nn.Sigmoid(),
                          nn.Flatten(), nn.Linear(64, 16, bias=False), nn.Tanh(),
                          nn.Linear(16, 16, bias=False), nn.GELU(),
                          nn.Linear(16, 5, bias=False))
    path = torch.onnx.export(model, (x,), str(tmp_path / "tables.onnx"), dynamo=False,
                             input_names=["x"], opset_version=20) or tmp_path / "tables.onnx"
    from_onnx = ub.compile(path, (x,), y, precision="int8", optimizer=config,
                           out_dir=tmp_path / "onnx")
    from_module = ub.compile(model, (x,), y, precision="int8", optimizer=config,
                             out_dir=tmp_path / "module")
    with from_onnx.build() as a, from_module.build() as b:
        for xb, yb in data:
            assert a.step(xb, yb) == b.step(xb, yb)
        assert np.array_equal(a.predict(data[0][0]), b.predict(data[0][0]))
