"""Kernel fusion (lowering/fusion.py) changes how the step is computed, never what: the fused
step gives the unfused step's losses and parameters bit for bit, and an internal buffer only
lives in an output when every element is read before it is overwritten."""

import copy

import numpy as np
import pytest
import torch
from torch import nn
from tvm import te

import ubitrain as ub
from ubitrain.kernels.schedules import schedule
from ubitrain.kernels.tir_access import output_reuse
from ubitrain.lowering.tir_lower import lower_prim_func
from ubitrain.zoo import ZOO


@pytest.mark.parametrize("model_name", ["mobilenetv2_small", "mlp_layernorm_gelu"])
def test_fused_step_equals_unfused_step_bit_for_bit(model_name, tmp_path):
    """MobileNetV2-style: conv + BN + ReLU6 (the ReLU6 in the BatchNorm's normalisation
    kernel), depthwise, residual add; the MLP: LayerNorm, GELU, softmax cross-entropy. Adam,
    so that the update's epilogue is exercised too."""
    entry = ZOO[model_name]
    torch.manual_seed(1)
    model = entry.factory().train()
    batches = [(torch.randn(4, *entry.sample_shape), torch.randint(0, 10, (4,)))
               for _ in range(3)]
    runs = {}
    for fusion in (False, True):
        pkg = ub.compile(copy.deepcopy(model), batches[0][:1], batches[0][1],
                         optimizer=ub.Adam(lr=1e-3, weight_decay=1e-4),
                         disable_passes=() if fusion else ("fuse_kernels",),
                         out_dir=tmp_path / f"fusion_{fusion}")
        trainer = pkg.build()
        losses = [trainer.step(x, y) for x, y in batches]
        logits = trainer.predict(batches[0][0])
        runs[fusion] = (pkg, losses, logits, trainer.parameters())
    (plain, losses0, logits0, params0), (fused, losses1, logits1, params1) = runs[False], runs[True]
    assert len(fused.programs["train_step"].calls) < len(plain.programs["train_step"].calls)
    assert fused.kernel_count < plain.kernel_count
    if model_name == "mobilenetv2_small":  # each ReLU6 runs inside its BatchNorm's y kernel
        clips = [c.kernel for c in fused.programs["train_step"].calls
                 if "clip" in c.kernel and "backward" not in c.kernel]  # not the masks
        assert clips and all("batch_norm_apply" in k for k in clips), clips
    assert losses1 == losses0
    assert np.array_equal(logits1, logits0)
    for name, value in params0.items():
        assert np.array_equal(params1[name], value), name


def _lowered(*tensors):
    return lower_prim_func(schedule(te.create_prim_func(list(tensors))))


def test_an_epilogue_computes_in_its_output():
    """conv-like reduction, then out[i] = relu(tmp[i]): tmp lives in out (no scratch)."""
    a = te.placeholder((8, 16), "float32", "a")
    w = te.placeholder((4, 16), "float32", "w")
    k = te.reduce_axis((0, 16), "k")
    tmp = te.compute((8, 4), lambda i, j: te.sum(a[i, k] * w[j, k], axis=k), "tmp")
    out = te.compute((8, 4), lambda i, j: te.max(tmp[i, j], 0.0), "out")
    func = _lowered(a, w, out)
    assert list(output_reuse(func).values()) == [2]


def test_an_epilogue_that_reads_other_elements_keeps_its_buffer():
    """out[i, j] = tmp[i, 3 - j]: element j is read after out[i, 3 - j] overwrote it."""
    a = te.placeholder((8, 16), "float32", "a")
    w = te.placeholder((4, 16), "float32", "w")
    k = te.reduce_axis((0, 16), "k")
    tmp = te.compute((8, 4), lambda i, j: te.sum(a[i, k] * w[j, k], axis=k), "tmp")
    out = te.compute((8, 4), lambda i, j: tmp[i, 3 - j] + tmp[i, j], "out")
    assert output_reuse(_lowered(a, w, out)) == {}


class SharedLayer(nn.Module):
    """One Linear read `uses` times, as an unrolled recurrent layer reads its weights once a
    time step: its gradient is a sum of `uses` weight-sized parts."""

    def __init__(self, width=32, uses=8):
        super().__init__()
        self.fc, self.uses = nn.Linear(width, width), uses

    def forward(self, x):
        for _ in range(self.uses):
            x = torch.tanh(self.fc(x))
        return x


def test_a_gradient_summed_over_many_uses_keeps_no_part_waiting(tmp_path):
    """Fused, the sum of a gradient's parts is not one kernel after the last part (which kept
    all 8 weight-sized parts alive: 2.2x the unfused arena): each add runs where the
    unfused step runs it (lowering/gradient_sums.py), with the same bits."""
    torch.manual_seed(0)
    model = SharedLayer()
    x, y = torch.randn(2, 32), torch.randn(2, 32)
    runs = {}
    for fusion in (False, True):
        pkg = ub.compile(copy.deepcopy(model), (x,), y, loss="mse",
                         disable_passes=() if fusion else ("fuse_kernels",),
                         optimizer=ub.SGD(lr=0.1, momentum=0.9), out_dir=tmp_path / f"{fusion}")
        trainer = pkg.build()
        runs[fusion] = pkg, [trainer.step(x, y) for _ in range(2)], trainer.parameters()
    (plain, losses0, params0), (fused, losses1, params1) = runs[False], runs[True]
    assert fused.memory_plan.arena_bytes <= plain.memory_plan.arena_bytes
    assert losses1 == losses0
    for name, value in params0.items():
        assert np.array_equal(params1[name], value), name
