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

from tools.int8_models import MODEL_IDS, MODELS
from ubitrain.errors import UnsupportedOpError
from ubitrain.fidelity.niti_reference import NitiGraphReference
from ubitrain.lowering.fused_kernels import legalize_fused_ops
from ubitrain.niti import loss, quantize
from ubitrain.niti.rescale import EXACT_COUNTED
from ubitrain.training.batch_norm_folding import fold_batch_norms
from ubitrain.training.graph import build_training_module
from ubitrain.training.niti_module import niti_training_module


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


def test_the_rewrite_refuses_a_constant_operand_by_op():
    """Past the up-front check (training/niti_ops.py), a constant an op reads is refused
    naming the op, not a KeyError: R.const(1.0) from inside a rule."""
    class PlusOne(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 10, bias=False)

        def forward(self, x):
            return self.fc(x.flatten(1)) + 1.0

    model, x, y = PlusOne(), torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    tm = build_training_module(model, (x,), y, "cross_entropy")
    with pytest.raises(UnsupportedOpError, match=r"relax.add \(\w+\) of the constant 1.0"):
        niti_training_module(tm, model, x, EXACT_COUNTED, 64)


def test_the_reference_step_against_independent_pieces():
    """One step of the reference by hand: PyTorch float64 convolutions of the integer
    tensors, each narrowed to int8 by the largest magnitude's bit length (NITI's counted
    shift, rounded half away from zero), the integer softmax gradient, and the last layer's
    weight gradient as the exact product of the error and its input."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 8, 3, stride=2, padding=1, bias=False), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32, 5, bias=False))
    x, y = torch.randn(4, 1, 8, 8), np.array([0, 1, 2, 3])
    params = {n: quantize.quantize(p.detach().numpy()) for n, p in model.named_parameters()}

    def narrowed(acc, e):
        s = max(0, int(np.abs(acc).max()).bit_length() - 7)
        out = np.sign(acc) * np.floor(np.abs(acc) / 2 ** s + 0.5)
        return np.clip(out, -127, 127), e + s

    def conv(a, name, stride, e):
        w, ew = params[name]
        acc = nn.functional.conv2d(torch.tensor(a, dtype=torch.float64),
                                   torch.tensor(w, dtype=torch.float64), stride=stride,
                                   padding=1).numpy()
        return narrowed(acc, e + ew)

    x8, ex = quantize.quantize(x.numpy())
    h1, e1 = conv(x8, "0.weight", 1, ex)
    p1 = nn.functional.max_pool2d(torch.tensor(np.maximum(h1, 0)), 2).numpy()
    h2, e2 = conv(p1, "3.weight", 2, e1)
    flat = np.maximum(h2, 0).reshape(4, -1)
    w3, e3 = params["6.weight"]
    logits, e_logits = narrowed(flat @ w3.T.astype(np.float64), e2 + e3)
    err = loss.softmax_xent_grad(logits.astype(np.int64), e_logits, y)
    _, grads = NitiGraphReference(model, x).step(x.numpy(), y, params)
    want = err.astype(np.int64).T @ flat.astype(np.int64)
    assert np.abs(want).max() > 0
    np.testing.assert_array_equal(grads["6.weight"], want)
