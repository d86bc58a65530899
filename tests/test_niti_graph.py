"""The int8 step derived from the float training graph (training/niti_module.py), run by TVM,
against NITI's numpy reference read off the model's ATen graph (fidelity/niti_reference.py):
the same loss and the same int32 gradients, bit for bit, for chains and DAGs with biases and
residual adds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

from ubitrain.errors import UnsupportedOpError
from ubitrain.fidelity.niti_reference import NitiGraphReference
from ubitrain.lowering.fused_kernels import legalize_fused_ops
from ubitrain.niti.rescale import EXACT_COUNTED
from ubitrain.training.batch_norm_folding import fold_batch_norms
from ubitrain.training.graph import build_training_module
from ubitrain.training.niti_module import niti_training_module


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.body = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.body(h) + h)
        return self.head(torch.flatten(nn.functional.max_pool2d(h, 2), 1))


class DepthwiseAveraging(nn.Module):
    """A depthwise conv in a residual block, a grouped conv whose output is concatenated
    with its input, average pooling over windows that leave a column out, and a global
    average: the MobileNet- and DenseNet-style ops."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.grouped = nn.Conv2d(8, 8, 1, groups=2, bias=False)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.dw(h)) + h
        h = torch.cat([torch.relu(self.grouped(h)), h], 1)
        h = nn.functional.avg_pool2d(h, (2, 3))
        return self.head(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


class OrdinaryCNN(nn.Module):
    """Biases, BatchNorm (with running statistics a pretrained net would have), a depthwise
    conv, a residual add and ReLU6: what the int8 path must train. Each BatchNorm is folded into
    its conv (training/batch_norm_folding.py) before the integer step is derived."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8),
                                nn.ReLU())
        self.pw = nn.Sequential(nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16),
                                nn.ReLU6())
        self.head = nn.Linear(16, 10)
        gen = torch.Generator().manual_seed(2)
        for bn in (self.stem[1], self.dw[1], self.pw[1]):
            c = bn.num_features
            bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            bn.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.weight.data.copy_(torch.rand(c, generator=gen) + 0.5)
            bn.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)

    def forward(self, x):
        h = self.stem(x)
        h = self.dw(h) + h
        h = nn.functional.max_pool2d(self.pw(h), 2)
        return self.head(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


def chain(bias: bool):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=bias), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64, 10, bias=bias))


def run_graph(model, x, y):
    """The integer training function run by TVM's VM: (integer parameters, loss, gradients)."""
    tm = niti_training_module(build_training_module(model, (x,), y, "cross_entropy"), model, x,
                              EXACT_COUNTED, 64)
    mod = relax.transform.LegalizeOps()(legalize_fused_ops(tm.mod, "float64"))
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    args = [x.numpy(), y.numpy().astype(np.int32)] + [s.value for s in tm.graph.state]
    (loss, *_), grads = vm["main"](*(tvm.runtime.tensor(a) for a in args))
    state = {s.name: s.value for s in tm.graph.state}
    params = {n: (state[n], int(state[f"{n}.exponent"][0])) for n in tm.trainable}
    return params, float(loss.numpy()), {n: g.numpy() for n, g in zip(tm.trainable, grads)}


MODELS = [lambda: chain(False), lambda: chain(True), Residual, DepthwiseAveraging, OrdinaryCNN]
MODEL_IDS = ["chain", "chain_with_biases", "residual_with_biases", "depthwise_averaging",
             "batch_norm_depthwise_residual"]


@pytest.mark.parametrize("make", MODELS, ids=MODEL_IDS)
def test_the_integer_step_equals_the_numpy_reference(make):
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = fold_batch_norms(make())
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 1, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    params, loss, grads = run_graph(model, x, y)
    want_loss, want = NitiGraphReference(model, x).step(x.numpy(), y.numpy(), params)
    assert grads.keys() == want.keys() == params.keys()
    for name in want:
        assert np.abs(want[name]).max() > 0, f"{name}: a zero gradient checks nothing"
        assert want[name].dtype == np.int64 and np.abs(want[name]).max() < 2**31
        np.testing.assert_array_equal(grads[name].reshape(want[name].shape), want[name],
                                      err_msg=name)
    assert abs(loss - want_loss) <= 1e-6 * abs(want_loss)


def test_a_batch_norm_that_cannot_be_folded_is_refused_by_name():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.BatchNorm2d(4), nn.Flatten(),
                          nn.Linear(144, 10))
    with pytest.raises(UnsupportedOpError, match="BatchNorm 2 does not directly follow"):
        fold_batch_norms(model)
