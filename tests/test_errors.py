"""Bad input: each gets a clear error that names what is wrong, before any C runs."""

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub


def small_model():
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


X = torch.randn(4, 6)
Y = torch.tensor([0, 1, 2, 1])


class Cumsum(nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1)


def test_unsupported_op_names_module_path_and_op(tmp_path):
    model = nn.Sequential(nn.Linear(6, 8), nn.Sequential(nn.Linear(8, 8), Cumsum()),
                          nn.Linear(8, 3))
    with pytest.raises(ub.UnsupportedOpError) as err:
        ub.compile(model, (X,), Y, out_dir=tmp_path / "m")
    message = str(err.value)
    assert "1.1: aten.cumsum is not supported" in message
    assert "aten.sum" in message  # it says what would work instead
    assert not (tmp_path / "m").exists()  # nothing written


class Then(nn.Module):
    """A Linear(6, 3), then `fn` of its output."""

    def __init__(self, fn):
        super().__init__()
        self.fc, self.fn = nn.Linear(6, 3), fn

    def forward(self, x):
        return self.fn(self.fc(x))


@pytest.mark.parametrize("fn, fragment", [
    (lambda h: torch.cat([h, h[:, 2:1]], 1), r"a slice \[2:1:1\] that keeps nothing of 3"),
    (lambda h: torch.split(h, [0, 3], 1)[1], r"a split into empty parts \(sizes \[0, 3\]\)"),
], ids=["slice", "split"])
def test_empty_parts_are_unsupported(fn, fragment, tmp_path):
    """PyTorch allows tensors without elements; the step has no slot for them."""
    with pytest.raises(ub.UnsupportedOpError, match=fragment):
        ub.compile(Then(fn), (X,), Y, out_dir=tmp_path / "m")


@pytest.mark.parametrize("labels, fragment", [
    (torch.randn(4), "integer class labels"),
    (torch.tensor([[0], [1], [2], [1]]), "labels of shape [4]"),
])
def test_bad_labels_for_cross_entropy(labels, fragment, tmp_path):
    with pytest.raises(ub.CompileError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        ub.compile(small_model(), (X,), labels, out_dir=tmp_path / "m")


def test_bad_labels_for_mse(tmp_path):
    with pytest.raises(ub.CompileError, match="shaped like the model output"):
        ub.compile(small_model(), (X,), torch.randn(4, 2), loss="mse", out_dir=tmp_path / "m")


@pytest.mark.parametrize("kwargs, fragment", [
    ({"target": "esp32"}, "unknown target 'esp32'; available targets: host"),
    ({"loss": "hinge"}, "unknown loss 'hinge'; supported: cross_entropy, mse"),
    ({"optimizer": torch.optim.SGD}, "optimizer must be ub.SGD, ub.Adam or ub.AdamW"),
    ({"precision": "fp16"}, "precision 'fp16' is not available"),
    ({"trainable": ["0.weight", "nope"]}, r"trainable names \['nope'\] are not parameters"),
    ({"memory_budget": "12 apples"}, "is not a size"),
    ({"memory_budget": "64B"}, "the smallest budget that works"),
])
def test_bad_options(kwargs, fragment, tmp_path):
    with pytest.raises(ub.CompileError, match=fragment):
        ub.compile(small_model(), (X,), Y, out_dir=tmp_path / "m", **kwargs)


def test_bad_optimizer_hyperparameters():
    with pytest.raises(ub.CompileError, match="lr=-1"):
        ub.SGD(lr=-1)
    with pytest.raises(ub.CompileError, match="nesterov"):
        ub.SGD(lr=0.1, nesterov=True)
    with pytest.raises(ub.CompileError, match=r"betas\[1\]"):
        ub.Adam(betas=(0.9, 1.5))


def test_out_dir_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ub.CompileError, match="out_dir="):
        ub.compile(small_model(), (X,), Y, out_dir=blocker / "model")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    out = tmp_path_factory.mktemp("errs") / "small"
    return ub.compile(small_model(), (X,), Y, optimizer=ub.SGD(lr=0.1), out_dir=out).build()


@pytest.mark.parametrize("x, y, fragment", [
    (torch.randn(5, 6), Y, r"shape \[5, 6\]; it must be \[4, 6\] \(the batch size"),
    (torch.ones(4, 6, dtype=torch.int32), Y, "must be a float array"),
    (X, torch.randn(4), "must be an integer array"),
    (X, torch.tensor([0, 1, 2, 3]), r"class indices in \[0, 3\)"),
    (X, torch.tensor([0, 1]), r"labels has shape \[2\]"),
])
def test_bad_step_batches(trainer, x, y, fragment):
    before = trainer.parameters()
    with pytest.raises(ub.InputError, match=fragment):
        trainer.step(x, y)
    after = trainer.parameters()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_non_finite_loss_leaves_parameters_unchanged(trainer):
    before = trainer.parameters()
    steps = trainer.steps
    bad = X.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ub.RuntimeStatusError, match="not finite"):
        trainer.step(bad, Y)
    after = trainer.parameters()
    assert trainer.steps == steps
    assert all(np.array_equal(before[k], after[k]) for k in before)
    trainer.step(X, Y)  # and training goes on
    assert trainer.steps == steps + 1


def test_load_parameters_checks_names_and_shapes(trainer):
    with pytest.raises(ub.InputError, match="unknown parameter names"):
        trainer.load_parameters({"nope": np.zeros(3)})
    with pytest.raises(ub.InputError, match="parameter '0.bias' has shape"):
        trainer.load_parameters({"0.bias": np.zeros(3)})
    trainer.load_parameters({"0.bias": np.full(8, 0.5, np.float32)})
    assert np.array_equal(trainer.parameters()["0.bias"], np.full(8, 0.5, np.float32))


def test_data_dependent_control_flow_is_a_clear_compile_error(tmp_path):
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 3)

        def forward(self, x):
            if x.sum() > 0:  # depends on the data: no static step can be compiled
                return self.fc(x)
            return -self.fc(x)

    with pytest.raises(ub.CompileError, match="static shapes and no data-dependent"):
        ub.compile(Branchy(), (X,), Y, out_dir=tmp_path / "m")


def test_int8_names_the_op_that_has_no_integer_form(tmp_path):
    """NITI has no integer LayerNorm: the message names the module, the op and the way out."""
    model = nn.Sequential(nn.Linear(X.shape[1], 8), nn.LayerNorm(8), nn.Linear(8, 3))
    with pytest.raises(ub.CompileError, match="no integer .NITI. form for 1: aten.layer_norm.*"
                                              "precision='fp32'"):
        ub.compile(model, (X,), Y, precision="int8", out_dir=tmp_path / "m")


@pytest.mark.parametrize("fn, fragment", [
    (lambda h: h + 1.0, r"<top>: aten.add.Tensor\(x, 1.0\)"),
    # torch leaves out arguments equal to the defaults: they are filled in
    (nn.Hardtanh(-1, 1), r"fn: aten.hardtanh\(x, -1, 1\)"),
    (nn.Hardtanh(0, 2.5), r"fn: aten.hardtanh\(x, 0, 2.5\)"),
], ids=["add-constant", "hardtanh", "relu6-fraction"])
def test_int8_names_the_arguments_that_have_no_integer_form(fn, fragment, tmp_path):
    """An op with an integer form for some arguments only: refused up front with them (a
    constant added once raised KeyError: R.const(1.0) from the integer rewrite)."""
    with pytest.raises(ub.UnsupportedOpError, match="no integer .NITI. form for "
                                                    f"{fragment}.*precision='fp32'"):
        ub.compile(Then(fn), (X,), Y, precision="int8", out_dir=tmp_path / "m")


def test_model_that_is_not_a_model(tmp_path):
    with pytest.raises(ub.CompileError, match="torch.nn.Module, an .onnx path"):
        ub.compile(object(), (X,), Y, out_dir=tmp_path / "m")
