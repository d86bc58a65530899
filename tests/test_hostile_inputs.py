"""What a user can get wrong, and what must still end in a clear error or a right result with
nothing lost: recompiling, inputs, parameters, compile arguments. The same for float dtypes,
ONNX files, checkpoints, C names and the CLI: test_hostile_*.py."""


import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub


def test_recompiling_into_the_same_out_dir_runs_the_new_code(tmp_path):
    """The loader hands out a library a process already loaded from a path: the new trainer
    must not run the old code with the new shapes."""
    x, y = torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))
    for width in (6, 4, 6):
        torch.manual_seed(width)
        model = nn.Sequential(nn.Flatten(), nn.Linear(12, width), nn.ReLU(), nn.Linear(width, 3))
        trainer = ub.compile(model, (x,), y, out_dir=tmp_path / "same").build()
        assert trainer.parameters()["1.weight"].shape == (width, 12)
        with torch.no_grad():
            np.testing.assert_allclose(trainer.predict(x), model(x).numpy(), rtol=1e-5,
                                       atol=1e-6)


def test_load_parameters_writes_nothing_unless_every_entry_is_good(mlp_trainer):
    before = mlp_trainer.parameters()
    with pytest.raises(ub.InputError, match="parameter '3.weight' has shape"):
        mlp_trainer.load_parameters({"1.weight": np.ones((8, 12), np.float32),
                                 "3.weight": np.ones((2, 2), np.float32)})
    with pytest.raises(ub.InputError, match="unknown parameter names"):
        mlp_trainer.load_parameters({"1.weight": np.ones((8, 12), np.float32), "nope": 1})
    after = mlp_trainer.parameters()
    for name, value in before.items():
        assert np.array_equal(after[name], value), name


def test_labels_that_would_wrap_are_refused(mlp_trainer):
    x = np.zeros((4, 3, 2, 2), np.float32)
    for labels in (np.array([0, 1, 2, 2**32 + 1], np.int64),
                   np.array([0, 1, 2, 2**63 + 1], np.uint64),
                   np.array([0, 1, -(2**32) + 2, 1], np.int64)):
        with pytest.raises(ub.InputError, match="outside int32's range"):
            mlp_trainer.step(x, labels)


def test_shape_and_dtype_messages_name_what_is_wrong(mlp_trainer):
    x = np.zeros((4, 3, 2, 2), np.float32)
    with pytest.raises(ub.InputError, match=r"parameter '1.bias' has shape \[3\]; it must be "
                                            r"\[8\]$"):
        mlp_trainer.load_parameters({"1.bias": np.zeros(3, np.float32)})
    with pytest.raises(ub.InputError, match="recompile for another one"):
        mlp_trainer.step(np.zeros((2, 3, 2, 2), np.float32), np.zeros(2, np.int64))
    with pytest.raises(ub.InputError, match=r"dtype int64; it must be a float array \(float32\)"):
        mlp_trainer.step(x.astype(np.int64), np.zeros(4, np.int64))
    with pytest.raises(ub.InputError, match=r"labels has dtype float32; it must be an integer "
                                            r"array \(int32\)"):
        mlp_trainer.step(x, np.zeros(4, np.float32))


# ---- compile arguments -----------------------------------------------------------------------
@pytest.mark.parametrize("make,match", [
    (lambda: ub.SGD(lr="fast"), "lr='fast' must be a number, not str"),
    (lambda: ub.SGD(momentum=None), "momentum=None must be a number"),
    (lambda: ub.SGD(lr=float("nan")), "lr=nan is out of range"),
    (lambda: ub.SGD(momentum=0.9, nesterov="yes"), r"nesterov='yes'\) must be True or False"),
    (lambda: ub.Adam(betas=0.9), "betas=0.9 must be a pair"),
    (lambda: ub.AdamW(weight_decay=True), "weight_decay=True must be a number"),
])
def test_optimizer_arguments_of_the_wrong_type(make, match):
    with pytest.raises(ub.CompileError, match=match):
        make()


def test_an_empty_batch_is_refused(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(ub.CompileError, match=r"example input 0 has shape \[0, 3, 2, 2\]: it "
                                              "holds no element"):
        ub.compile(model, (torch.zeros(0, 3, 2, 2),), torch.zeros(0, dtype=torch.long),
                   out_dir=tmp_path)
