"""Fused training ops (BatchNorm, LayerNorm, softmax + cross-entropy, and GELU as one op):
one node for the Gradient pass,
one kernel each way, and the same numbers as PyTorch autograd in float64.

BatchNorm goes through `op_harness` (forward output, gradients w.r.t. input, gamma and
beta, running statistics) with channels whose mean is far above their spread, the case
where a variance gradient written as 2/n x - 2/n^2 sum(x) cancels. Cross-entropy is
checked on logits that are a trained parameter, so one SGD(lr=1) step leaves exactly
-dloss/dlogits in it; rows with logits in the hundreds overflow exp() without the row max
subtracted.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from harness import rel_err
from op_harness import randn, run_op
from torch import nn
from tvm import relax, tirx

import ubitrain as ub
from ubitrain.api import lower
from ubitrain.ops.fused_ops import fused_op_of
from ubitrain.training.graph import build_training_module


def _channels(x, offsets, spreads):
    """x with channel c scaled by spreads[c] and shifted by offsets[c]."""
    view = (1, -1) + (1,) * (x.dim() - 2)
    return x * torch.tensor(spreads).view(view) + torch.tensor(offsets).view(view)


def _seeded_bn(bn, seed=3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.weight.copy_(torch.randn(bn.weight.shape, generator=gen) * 0.5 + 1.0)
        bn.bias.copy_(torch.randn(bn.bias.shape, generator=gen) * 0.5)
        bn.running_mean.copy_(torch.randn(bn.running_mean.shape, generator=gen))
        bn.running_var.copy_(torch.rand(bn.running_var.shape, generator=gen) + 0.5)
    return bn


@pytest.mark.parametrize("module,x", [
    # channel 1: mean 100 over a spread of 0.1; channel 2: mean -30 over 0.05
    (nn.BatchNorm2d(3, momentum=0.25),
     _channels(randn(4, 3, 5, 6), [0.5, 100.0, -30.0], [2.0, 0.1, 0.05])),
    (nn.BatchNorm1d(4, momentum=0.1),
     _channels(randn(6, 4, seed=1), [0.0, 60.0, -2.0, 1.0], [1.0, 0.06, 3.0, 0.5])),
], ids=["nchw_large_mean", "2d_large_mean"])
def test_batch_norm_matches_autograd(module, x, tmp_path):
    res = run_op(_seeded_bn(module), (x,), tmp_path)
    res.check()
    for key in ("grad:d_in0", "grad:d_weight", "grad:d_bias", "buffer:inner.running_mean",
                "buffer:inner.running_var", "output"):
        assert key in res.want


class Logits(nn.Module):
    """The input plus a trained zero tensor: the loss's gradient lands in `d`."""

    def __init__(self, shape):
        super().__init__()
        self.d = nn.Parameter(torch.zeros(shape))

    def forward(self, x):
        return x + self.d


@pytest.mark.parametrize("scale", [3.0, 300.0], ids=["moderate", "exp_overflows_f32"])
def test_softmax_cross_entropy_matches_autograd(scale, tmp_path):
    logits = randn(5, 7, seed=2) * scale
    labels = torch.tensor([0, 6, 3, 3, 1])
    model = Logits(logits.shape)
    pkg = ub.compile(model, (logits,), labels, loss="cross_entropy",
                     optimizer=ub.SGD(lr=1.0), out_dir=tmp_path / "ce")
    trainer = pkg.build()
    got_loss = trainer.step(logits.numpy(), labels.numpy().astype(np.int64))
    got_grad = -trainer.parameters()["d"]

    z = logits.double().requires_grad_()
    want = torch.nn.functional.cross_entropy(z, labels)
    want.backward()
    assert np.isfinite(got_loss)
    assert rel_err(got_loss, want.item()) <= 1e-6
    assert rel_err(got_grad, z.grad.numpy()) <= 1e-6


def _fused_calls(func: relax.Function):
    calls = []
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Call):
                found = fused_op_of(binding.value)
                if found:
                    calls.append((found[0], list(binding.value.args[1].fields), binding.var))
    return calls


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def test_one_node_each_way_and_backward_reads_only_the_input():
    """The training graph has one fused call per BatchNorm and loss in each direction, none
    of the decomposed chain, and the BatchNorm backward reads the BatchNorm input itself
    (with gamma, the saved per-channel mean and rstd, and dy): no x - mean, x_hat or y."""
    x, y = randn(2, 2, 4, 4), torch.tensor([1, 4])
    tm = build_training_module(ConvBN(), (x,), y, "cross_entropy")
    main = tm.mod["main"]
    calls = _fused_calls(main)
    names = sorted(name for name, _, _ in calls)
    assert names == ["batch_norm_train", "batch_norm_train_backward", "softmax_cross_entropy",
                     "softmax_cross_entropy_backward"]
    ops = {b.value.op.name for blk in main.body.blocks for b in blk.bindings
           if isinstance(b.value, relax.Call) and hasattr(b.value.op, "name")}
    assert not ops & {"relax.variance", "relax.rsqrt", "relax.nn.log_softmax",
                      "relax.nn.nll_loss"}
    (fwd_args, fwd_out), = [(a, v) for n, a, v in calls if n == "batch_norm_train"]
    (bwd_args, _), = [(a, v) for n, a, v in calls if n == "batch_norm_train_backward"]
    assert bwd_args[0].same_as(fwd_args[0])  # x, the BatchNorm input
    for arg, index in zip(bwd_args[2:4], (1, 2)):  # the saved mean and rstd
        value = _bound(main, arg)
        assert isinstance(value, relax.TupleGetItem) and value.index == index
        assert value.tuple_value.same_as(fwd_out)


class LinearLayerNormGELU(nn.Module):
    def __init__(self, approximate):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3)
        self.act = nn.GELU(approximate=approximate)

    def forward(self, x):
        return self.fc2(self.act(self.norm(self.fc1(x))))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_layer_norm_and_gelu_backward_read_only_their_inputs(approximate):
    """LayerNorm is one fused call each way whose backward reads the LayerNorm input and
    the saved per-row mean and rstd; GELU is one op, and every value its backward reads
    from the forward pass is its input (not x / sqrt(2), erf or tanh of it)."""
    tm = build_training_module(LinearLayerNormGELU(approximate), (randn(4, 6),),
                               torch.tensor([0, 2, 1, 0]), "cross_entropy")
    main = tm.mod["main"]
    calls = _fused_calls(main)
    (fwd_args, fwd_out), = [(a, v) for n, a, v in calls if n == "layer_norm"]
    (bwd_args, _), = [(a, v) for n, a, v in calls if n == "layer_norm_backward"]
    assert bwd_args[0].same_as(fwd_args[0])
    for arg, index in zip(bwd_args[2:4], (1, 2)):
        value = _bound(main, arg)
        assert isinstance(value, relax.TupleGetItem) and value.index == index
        assert value.tuple_value.same_as(fwd_out)
    bindings = [b for blk in main.body.blocks for b in blk.bindings]
    gelu_op = "relax.nn.gelu_tanh" if approximate == "tanh" else "relax.nn.gelu"
    (gelu,) = [b for b in bindings if isinstance(b.value, relax.Call)
               and getattr(b.value.op, "name", "") == gelu_op]
    gelu_at = bindings.index(gelu)
    forward = {b.var for b in bindings[:gelu_at + 1]}
    gelu_input = gelu.value.args[0]
    after = bindings[gelu_at + 1:]
    read_from_forward = {a for b in after if isinstance(b.value, relax.Call)
                         and getattr(b.value.op, "name", "") in ("relax.erf", "relax.tanh",
                                                                  "relax.multiply")
                         for a in b.value.args if a in forward}
    assert read_from_forward == {gelu_input}
    assert not any(getattr(b.value.op, "name", "") in ("relax.erf", "relax.tanh")
                   for b in bindings[:gelu_at] if isinstance(b.value, relax.Call))


def _bound(func, var):
    for block in func.body.blocks:
        for binding in block.bindings:
            if binding.var.same_as(var):
                return binding.value
    return var


def test_fused_kernels_may_write_over_a_dying_input():
    """The reductions of a fused kernel read its input before the elementwise output nest
    starts, and BatchNorm's y is elementwise in x, so y may overwrite x (BatchNorm whose
    input gets no gradient), dx may overwrite
    dy or x, and the loss gradient the logits. Convolution-style reads stay excluded."""
    from ubitrain.kernels.schedules import schedule
    from ubitrain.kernels.tir_access import in_place_pairs
    from ubitrain.lowering.tir_lower import lower_prim_func
    x, y = randn(2, 2, 4, 4), torch.tensor([1, 4])
    mod = lower(ConvBN(), (x,), y, disable_passes=("fuse_kernels",)).mod  # legalized, unfused
    pairs = {gvar.name_hint: in_place_pairs(lower_prim_func(schedule(func)))
             for gvar, func in mod.functions.items() if isinstance(func, tirx.PrimFunc)}
    assert (0, 5) in pairs["batch_norm_apply"]  # x -> y
    assert pairs["batch_norm_stats"] == [(1, 5), (2, 6)]  # running statistics -> new ones
    assert {(0, 5), (4, 5)} <= set(pairs["batch_norm_train_backward"])  # x, dy -> dx
    assert pairs["softmax_cross_entropy_backward"] == [(0, 3)]  # logits -> dlogits
    assert pairs["softmax_cross_entropy"] == []  # a scalar output
