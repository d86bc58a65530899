"""ONNX files a user can get wrong: opsets, attributes, undefined tensors, inference
exports, float64, empty and corrupt files, each refused by name."""

import re

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub


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


@pytest.mark.parametrize("options,sign", [
    ({}, r"Conv node .* reads 'onnx::Conv_\d+', a constant the exporter folded"),
    ({"do_constant_folding": False}, r"BatchNormalization node .* has training_mode=0"),
    ({"training": "TRAINING", "do_constant_folding": False}, None),
])
def test_an_onnx_model_exported_for_inference_is_named_with_the_export_to_use(options, sign,
                                                                             tmp_path):
    """Before: an eval-mode export (BatchNorm folded into the conv, or frozen) compiled
    silently and trained unlike the module."""
    import warnings

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Dropout(0.2), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x, y = torch.randn(2, 1, 6, 6), torch.tensor([0, 2])
    if "training" in options:
        options = dict(options, training=torch.onnx.TrainingMode.TRAINING)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, **options)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ub.compile(str(path), (x,), y, out_dir=tmp_path / "out")
    ours = [str(w.message) for w in seen if issubclass(w.category, ub.UbitrainWarning)]
    if sign is None:
        assert ours == []
        return
    assert len(ours) == 1, ours
    assert re.search(r"^the ONNX model was exported for inference: " + sign, ours[0]), ours[0]
    assert ours[0].endswith("export for training: torch.onnx.export(model, args, path, "
                            "dynamo=False, training=torch.onnx.TrainingMode.TRAINING, "
                            "do_constant_folding=False)")


def test_an_onnx_model_in_float64_is_refused_by_name(tmp_path):
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.eye(3), "w")  # float64
    model = _onnx([helper.make_node("MatMul", ["x", "w"], ["y"])], initializers=[w])
    with pytest.raises(ub.CompileError, match="the ONNX model's initializer 'w' is float64; "
                                              "ubitrain trains float32 models"):
        _compile_onnx(model, tmp_path)


def test_empty_and_corrupt_onnx_files(tmp_path):
    empty, garbage = tmp_path / "empty.onnx", tmp_path / "garbage.onnx"
    empty.write_bytes(b"")
    garbage.write_bytes(b"hello world")
    with pytest.raises(ub.CompileError, match="has no nodes"):
        _compile_onnx(str(empty), tmp_path)
    with pytest.raises(ub.CompileError, match="cannot read the ONNX model"):
        _compile_onnx(str(garbage), tmp_path)
