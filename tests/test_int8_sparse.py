"""SparseUpdate(channels=...) with precision="int8" (docs/int8.md, "Training part of a layer's
channels"): the split layer computes what the unsplit one would, only its first rows train
(NITI's update of the whole weight with the frozen rows' gradient zero), the frozen rows and
every exponent stay as they were; the C equals the numpy reference, which reads the rows off
the model and the SparseUpdate (fidelity/niti_sparse.py), bit for bit."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub
from tools.int8_models import DepthwiseAveraging, Residual, int8_batches
from ubitrain.fidelity.niti_check import compare_with_reference

STEPS = 4
# body: the conv whose input the residual add reads too; head: the Linear
RULE = ub.SparseUpdate(biases=True, channels={"body": 0.5, "head": 0.25})
ROWS = {"body.weight": 2, "head.weight": 3}  # ceil(0.5 * 4), ceil(0.25 * 10)


def spread_residual():
    """The residual net with its channels' scales spread, the largest in a frozen row: with
    an exponent per channel, the trained rows' coarsest is not the weight's."""
    torch.manual_seed(0)
    model = Residual()
    with torch.no_grad():
        model.body.weight[3] *= 8
        model.body.weight[0] /= 4
        model.head.weight[9] *= 16
        model.head.weight[1] /= 4
    return model


@pytest.mark.parametrize("exponents,micro_batches",
                         [("tensor", 1), ("channel", 1), ("channel", 2)])
def test_a_fraction_of_channels_trains_as_the_numpy_reference(exponents, micro_batches,
                                                              tmp_path):
    """(With micro-batches too: the parts' int32 gradients summed over them as a whole
    weight's, docs/int8.md "Micro-batches".)"""
    warnings.simplefilter("ignore")
    model, batches = spread_residual(), int8_batches(STEPS)
    config = ub.NITI(mu=(5, 4), milestones=(2,), weight_exponents=exponents)
    pkg = ub.compile(copy.deepcopy(model), (batches[0][0],), batches[0][1], precision="int8",
                     optimizer=config, trainable=RULE, micro_batches=micro_batches,
                     out_dir=tmp_path / "net", progress=False)
    assert pkg.memory_plan.micro_batches == micro_batches
    assert pkg.trainable == ["stem.bias", "body.weight[0:2]", "body.bias", "head.weight[0:3]",
                             "head.bias"]
    grads = [s.shape for s in pkg.programs["train_step"].slots() if s.kind == "gradient"]
    assert (2, 4, 3, 3) in grads and (4, 4, 3, 3) not in grads  # the trained rows' only
    with pkg.build() as trainer:
        initial = trainer.int8_parameters()
        if exponents == "channel":
            e = initial["body.weight.exponent"]
            assert e[ROWS["body.weight"]:].max() > e[:ROWS["body.weight"]].max()
        run = compare_with_reference(trainer, model, [(x.numpy(), y.numpy())
                                                      for x, y in batches], config,
                                     trainable=RULE)
        final = trainer.int8_parameters()
    assert run.differences == []
    for name, rows in ROWS.items():
        assert np.array_equal(final[name][rows:], initial[name][rows:]), name  # frozen
        assert not np.array_equal(final[name][:rows], initial[name][:rows]), name
        assert np.array_equal(final[f"{name}.exponent"], initial[f"{name}.exponent"]), name
    assert np.array_equal(final["stem.weight"], initial["stem.weight"])


def test_a_fraction_of_a_linear_needs_less_memory(tmp_path):
    """As in fp32: the weight gradient of the trained rows only, and a smaller arena."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    x, y = int8_batches(1)[0]
    plans, grads = {}, {}
    for label, fraction in (("quarter", 0.25), ("whole", 1.0)):
        pkg = ub.compile(copy.deepcopy(model), (x,), y, precision="int8", progress=False,
                         trainable=ub.SparseUpdate(channels={"4": fraction}),
                         out_dir=tmp_path / label)
        plans[label] = pkg.memory_plan.arena_bytes
        grads[label] = [s.shape for s in pkg.programs["train_step"].slots()
                        if s.kind == "gradient"]
    assert (16, 128) in grads["quarter"] and (64, 128) not in grads["quarter"]
    assert (64, 128) in grads["whole"]
    assert plans["quarter"] < plans["whole"]


def test_a_depthwise_fraction_is_refused_by_name(tmp_path):
    """As in fp32: a grouped conv's rows are not its output channels' own products."""
    x, y = int8_batches(1)[0]
    with pytest.raises(ub.CompileError, match=r"dw\.weight belongs to a grouped/depthwise "
                                              r"Conv2d.*train that layer whole"):
        ub.compile(DepthwiseAveraging(), (x,), y, precision="int8", progress=False,
                   trainable=ub.SparseUpdate(channels={"dw": 0.5}), out_dir=tmp_path / "dw")
