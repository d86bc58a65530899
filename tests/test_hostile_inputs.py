"""What a user can get wrong, and what must still end in a clear error or a right result with
nothing lost: recompiling, inputs, parameters, checkpoints, ONNX files, the CLI, the C API."""

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


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 3, 2, 2), torch.randint(0, 3, (4,))
    return ub.compile(model, (x,), y, out_dir=tmp_path_factory.mktemp("t")).build()


def test_load_parameters_writes_nothing_unless_every_entry_is_good(trainer):
    before = trainer.parameters()
    with pytest.raises(ub.InputError, match="parameter '3.weight' has shape"):
        trainer.load_parameters({"1.weight": np.ones((8, 12), np.float32),
                                 "3.weight": np.ones((2, 2), np.float32)})
    with pytest.raises(ub.InputError, match="unknown parameter names"):
        trainer.load_parameters({"1.weight": np.ones((8, 12), np.float32), "nope": 1})
    after = trainer.parameters()
    for name, value in before.items():
        assert np.array_equal(after[name], value), name


def test_labels_that_would_wrap_are_refused(trainer):
    x = np.zeros((4, 3, 2, 2), np.float32)
    for labels in (np.array([0, 1, 2, 2**32 + 1], np.int64),
                   np.array([0, 1, 2, 2**63 + 1], np.uint64),
                   np.array([0, 1, -(2**32) + 2, 1], np.int64)):
        with pytest.raises(ub.InputError, match="outside int32's range"):
            trainer.step(x, labels)


def test_shape_and_dtype_messages_name_what_is_wrong(trainer):
    x = np.zeros((4, 3, 2, 2), np.float32)
    with pytest.raises(ub.InputError, match=r"parameter '1.bias' has shape \[3\]; it must be "
                                            r"\[8\]$"):
        trainer.load_parameters({"1.bias": np.zeros(3, np.float32)})
    with pytest.raises(ub.InputError, match="recompile for another one"):
        trainer.step(np.zeros((2, 3, 2, 2), np.float32), np.zeros(2, np.int64))
    with pytest.raises(ub.InputError, match=r"dtype int64; it must be a float array \(float32\)"):
        trainer.step(x.astype(np.int64), np.zeros(4, np.int64))
    with pytest.raises(ub.InputError, match=r"labels has dtype float32; it must be an integer "
                                            r"array \(int32\)"):
        trainer.step(x, np.zeros(4, np.float32))


# ---- ONNX files ------------------------------------------------------------------------------
def _onnx(nodes, opset=17, inputs=(("x", [2, 3]),), initializers=()):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _compile_onnx(model, tmp_path, **kw):
    return ub.compile(model, (torch.randn(2, 3),), torch.randn(2, 3), loss="mse",
                      out_dir=tmp_path / "onnx", **kw)


def test_onnx_clip_of_opset_6_clips_with_its_attributes(tmp_path):
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.eye(3, dtype=np.float32) * 30, "w")
    model = _onnx([helper.make_node("MatMul", ["x", "w"], ["h"]),
                   helper.make_node("Clip", ["h"], ["y"], min=0.0, max=0.1)], opset=6,
                  initializers=[w])
    trainer = _compile_onnx(model, tmp_path).build()
    out = trainer.predict(np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32))
    assert out.min() >= 0.0 and out.max() <= np.float32(0.1)


@pytest.mark.parametrize("opset,match", [
    (99, "opset 99, newer than the newest"),
    (5, r"Add-1 \(opset 5\) is not supported; Add is from version 7 on"),
])
def test_onnx_opsets_outside_what_is_implemented_are_refused(opset, match, tmp_path):
    from onnx import helper

    with pytest.raises(ub.UnsupportedOpError, match=match):
        _compile_onnx(_onnx([helper.make_node("Add", ["x", "x"], ["y"])], opset=opset), tmp_path)


def test_onnx_attributes_the_converter_does_not_implement_are_refused(tmp_path):
    from onnx import helper

    model = _onnx([helper.make_node("ReduceMean", ["x"], ["y"], keepdims=1,
                                    noop_with_empty_axes=1)], opset=18)
    with pytest.raises(ub.UnsupportedOpError, match="noop_with_empty_axes=1 is not supported"):
        _compile_onnx(model, tmp_path)


def test_onnx_node_reading_an_undefined_tensor(tmp_path):
    from onnx import helper

    with pytest.raises(ub.CompileError, match="reads 'nothere', which no graph input"):
        _compile_onnx(_onnx([helper.make_node("Relu", ["nothere"], ["y"])]), tmp_path)


def test_empty_and_corrupt_onnx_files(tmp_path):
    empty, garbage = tmp_path / "empty.onnx", tmp_path / "garbage.onnx"
    empty.write_bytes(b"")
    garbage.write_bytes(b"hello world")
    with pytest.raises(ub.CompileError, match="has no nodes"):
        _compile_onnx(str(empty), tmp_path)
    with pytest.raises(ub.CompileError, match="cannot read the ONNX model"):
        _compile_onnx(str(garbage), tmp_path)


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
