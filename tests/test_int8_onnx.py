"""precision="int8" from an ONNX file: the generated C trains bit for bit like the build of
the PyTorch module it was exported from, which trains like NITI's numpy reference."""

import numpy as np
import pytest
import torch
from niti_harness import check_against_reference, niti_batches
from torch import nn

import ubitrain as ub
from ubitrain.frontend.onnx_aten import MAPPED
from ubitrain.frontend.onnx_import import ONNX_CONVERTERS


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


class Then(nn.Module):
    """A conv and its ReLU, `fn` of that (and of a second conv's output of it), a Linear."""

    def __init__(self, fn, middle=None):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.conv2 = nn.Conv2d(1, 4, 3, padding=1, bias=False), \
            nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.fn, self.middle = fn, middle or nn.Identity()
        self.fc = nn.Linear(256, 5, bias=False)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        return self.fc(torch.flatten(self.fn(self.middle(h), self.conv2(h)), 1))


@pytest.mark.parametrize("fn, middle, opset, fragment", [
    (lambda h, g: h + 1.0, None, 17, r"node '/Add' \(Add\): aten.add.Tensor\(x, 1.0\)"),
    (lambda h, g: h * g, None, 17, r"node '/Mul' \(Mul\): aten.mul.Tensor"),
    (lambda h, g: h @ g, None, 17, r"node '/MatMul' \(MatMul\): aten.matmul"),
    (lambda h, g: h, nn.LayerNorm([4, 8, 8]), 17,
     r"node '/middle/LayerNormalization' \(LayerNormalization\): aten.layer_norm"),
    (lambda h, g: h, nn.Hardtanh(-1, 1), 17,
     r"node '/middle/Clip' \(Clip\): aten.hardtanh\(x, -1.0, 1.0\)"),
    (lambda h, g: h, nn.SiLU(), 17, r"node '/middle/Mul' \(Mul\): aten.mul.Tensor"),
    (lambda h, g: h, nn.GELU(), 17, r"node '/middle/Erf' \(Erf\): aten.erf.*"
                                    r"export with opset_version=20 for one Gelu node"),
    (lambda h, g: h.transpose(2, 3), None, 17, r"node '/Transpose' \(Transpose\): aten.permute"),
], ids=["add-constant", "mul", "matmul", "layer-norm", "hardtanh", "silu", "gelu-erf",
        "transpose"])
def test_onnx_int8_names_the_node_that_has_no_integer_form(fn, middle, opset, fragment,
                                                          tmp_path):
    """The module's check (training/niti_ops.py) on the ONNX nodes, each read as the ATen op
    it computes: refused up front by node, op type and ATen op, not deep in the rewrite (a
    constant added once raised KeyError: R.const(1.0)), nor compiled unchecked (MatMul of two
    activations, Transpose)."""
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    path = torch.onnx.export(Then(fn, middle), (x,), str(tmp_path / "m.onnx"), dynamo=False,
                             input_names=["x"], opset_version=opset) or tmp_path / "m.onnx"
    with pytest.raises(ub.UnsupportedOpError, match="precision='int8': no integer .NITI. form "
                       f"for .*{fragment}.*precision='fp32'"):
        ub.compile(path, (x,), y, precision="int8", out_dir=tmp_path / "out")


def test_an_onnx_batch_norm_is_refused_with_the_way_out(tmp_path):
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    model = Then(lambda h, g: h, nn.BatchNorm2d(4))
    path = tmp_path / "bn.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"],
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    with pytest.raises(ub.UnsupportedOpError, match=r"node '/middle/BatchNormalization' "
                       r"\(BatchNormalization\).*compile the PyTorch module itself"):
        ub.compile(path, (x,), y, precision="int8", out_dir=tmp_path / "out")


def test_an_onnx_op_no_precision_converts_keeps_the_importers_error(tmp_path):
    """Softmax has no ONNX converter at all: the int8 message would wrongly offer fp32."""
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    path = export(Then(lambda h, g: h, nn.Softmax(1)), x, tmp_path / "softmax.onnx")
    with pytest.raises(ub.UnsupportedOpError, match="node '/middle/Softmax': ONNX op Softmax "
                       "is not supported"):
        ub.compile(path, (x,), y, precision="int8", out_dir=tmp_path / "out")


def test_supported_onnx_patterns_pass_the_check(tmp_path):
    """ReLU6 (Clip(0, 6)), a residual add, a Gemm with its bias and the global average pass
    the check and compile; shape arithmetic (x.view(x.size(0), -1)) is not checked."""
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
            self.fc = nn.Linear(4, 5)

        def forward(self, x):
            h = nn.functional.relu6(self.conv(x))
            h = torch.relu(h + self.conv2(h)).mean((2, 3), keepdim=True)
            return self.fc(h.view(h.size(0), -1))

    data = niti_batches(1)
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    path = export(Residual(), x, tmp_path / "residual.onnx")
    pkg = ub.compile(path, (x,), y, precision="int8", out_dir=tmp_path / "out")
    assert "fc.bias" in pkg.integer_parameters


def test_every_op_the_importer_converts_has_an_aten_reading():
    """A converter added without one would be refused by the int8 check as 'no ATen op'."""
    assert set(ONNX_CONVERTERS) <= MAPPED
