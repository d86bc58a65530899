"""Models, inputs and factories in float dtypes other than float32: compiled as a float32
copy with one warning, or refused by name."""

import copy

import pytest
import torch
from harness import run_cli
from torch import nn

import ubitrain as ub


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_a_model_in_another_float_dtype_trains_as_its_float32_copy(dtype, tmp_path):
    """Before: float64 and float16 crashed the process in TVM's legalization, bfloat16 raised a
    bare TypeError. Now the C trains model.float() as PyTorch does, with a warning."""
    from harness import assert_trains_like_torch, batches

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)
    name = str(dtype).replace("torch.", "")
    with pytest.warns(ub.UbitrainWarning, match=f"'1.weight', .* are {name}; ubitrain trains "
                                                "in float32"):
        assert_trains_like_torch(copy.deepcopy(model).float(), batches((4, 3, 2, 2), 3, 2),
                                 ub.SGD(0.1), tmp_path, compiled=model)
    assert {p.dtype for p in model.parameters()} == {dtype}  # the user's model as it was


def test_float64_example_inputs_compile_a_float32_step(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x = torch.randn(4, 3, 2, 2, dtype=torch.float64)
    with pytest.warns(ub.UbitrainWarning, match="example input 0 is float64; the step is "
                                                "compiled for float32 batches"):
        pkg = ub.compile(model, (x,), torch.randn(4, 3, dtype=torch.float64), loss="mse",
                         out_dir=tmp_path / "f64in")
    assert [s.dtype for s in pkg.inputs] == ["float32"]


class _Double(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 3)

    def forward(self, x):
        return self.fc(x.flatten(1)).double().float()


@pytest.mark.parametrize("model,match", [
    (_Double(), r"<top>: aten._to_copy computes in float64; ubitrain trains in float32: keep "
                r"the forward in float32"),
    (nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).to(torch.complex64),
     r"parameter or buffer '1.weight' is complex64: ubitrain trains real float32 models"),
])
def test_a_forward_outside_float32_is_refused_by_name(model, match, tmp_path):
    with pytest.raises(ub.CompileError, match=match):
        ub.compile(model, (torch.randn(4, 3, 2, 2),), torch.randint(0, 3, (4,)),
                   out_dir=tmp_path)


def test_the_cli_compiles_a_float64_factory_with_one_warning_line(tmp_path):
    (tmp_path / "m.py").write_text("from torch import nn\n"
                                   "def f():\n    return nn.Sequential(nn.Flatten(), "
                                   "nn.Linear(12, 3)).double()\n")
    for loss in ("cross_entropy", "mse"):  # mse: the labels are shaped by running the model
        run = run_cli("compile", "m.py:f", "--input-shape", "3,2,2", "--batch", "2", "--loss",
                      loss, "--no-progress", "--out-dir", str(tmp_path / loss), cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert run.stderr.strip().splitlines() == [
            "warning: the model's '1.weight', '1.bias' are float64; ubitrain trains in "
            "float32: it compiles a float32 copy (model.float(), values rounded) and leaves "
            "your model as it is"], run.stderr
