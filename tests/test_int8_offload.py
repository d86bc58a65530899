"""The int8 step split between the CPU (host, or aarch64-neon under qemu-aarch64) and the DSP
(hexagon-v66 under qemu-hexagon), joined by the offload interface over pipes: bit for bit
NITI's numpy reference (fidelity/niti_check.py) on a net with biases, BatchNorm, a depthwise
conv and a residual add; and, with a DSP cache of one's own, the chain-only pipeline's
weight-gradient convs split by images against its own reference. A missing toolchain skips
locally and fails in CI (CI=true)."""

import numpy as np
import pytest
import torch
from harness import require_tools
from niti_harness import check_against_reference, check_chain_against_reference

import ubitrain as ub
from tools.int8_models import MODELS
from ubitrain.zoo import DigitsCNNNiti

STEPS = 3


def split_data(batch: int, seed: int):
    gen = np.random.default_rng(seed)
    return [(gen.standard_normal((batch, 1, 8, 8)).astype(np.float32),
             gen.integers(0, 10, batch)) for _ in range(STEPS)]


@pytest.mark.parametrize("cpu_target", ["host", "aarch64-neon"])
def test_split_step_equals_the_reference(cpu_target, tmp_path):
    """The CPU part in this process (host) or, the Android setting, built for aarch64 and run
    under qemu-aarch64, the two emulators joined by FIFOs; CPU kernels run while the DSP
    works on a segment."""
    require_tools("hexagon-v66")
    require_tools(cpu_target)
    data = split_data(16, 0)
    torch.manual_seed(0)
    model = MODELS[4]()  # biases, BatchNorm, a depthwise conv, a residual add
    config = ub.NITI(mu=(5, 4), milestones=(2,), adaptive_rescale=True, max_interval=2,
                     dsp_offload=True, cpu_target=cpu_target)
    split = ub.compile(model, (torch.from_numpy(data[0][0]),), torch.from_numpy(data[0][1]),
                       precision="int8", optimizer=config, target="hexagon-v66",
                       out_dir=tmp_path / "split", progress=False)
    on_dsp = [p.kernel for p in split.placement if p.where == "dsp"]
    assert len(split.segments) >= 2  # forward and backward runs on the DSP
    assert any("conv2d" in k for k in on_dsp)
    assert not any("softmax" in k or "quantize" in k for k in on_dsp)  # read the caller's data
    assert any(ov.kernels for ov in split.overlaps)
    check_against_reference(split, model, data, config)


def test_weight_gradients_split_by_images_equal_the_chain_reference(tmp_path):
    """A DSP cache of one's own (NITI(dsp_cache_bytes=...)) still goes through the chain-only
    pipeline, whose weight-gradient convs go image chunk by image chunk."""
    require_tools("hexagon-v66")
    gen = np.random.default_rng(0)
    data = [(gen.standard_normal((32, 1, 8, 8)).astype(np.float32), gen.integers(0, 10, 32))
            for _ in range(STEPS)]
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    torch.manual_seed(0)
    model = DigitsCNNNiti()
    # a cache of 5000 B splits the weight-gradient convs into chunks of 3 and 4 images (the
    # last chunk of 32 short), which must not change a bit
    split_config = ub.NITI(mu=(5,), milestones=(), adaptive_rescale=True, max_interval=2,
                           dsp_offload=True, dsp_cache_bytes=5000)
    split = ub.compile(model, (x,), y, precision="int8", optimizer=split_config,
                       target="hexagon-v66", out_dir=tmp_path / "split")
    assert len(split.segments) >= 2  # forward and backward runs on the DSP
    on_dsp = {p.op for p in split.placement if p.where == "dsp"}
    assert "conv2d" in on_dsp and "softmax_xent_grad" not in on_dsp
    dsp_source = (tmp_path / "split" / "dsp" / "dsp_main.c").read_text()
    assert "images go 3 at a time" in dsp_source and "images go 4 at a time" in dsp_source
    check_chain_against_reference(split, data, split_config)


def test_cpu_target_must_be_a_cpu():
    with pytest.raises(ub.CompileError, match="cpu_target='cortex-m4'.*host, aarch64-neon"):
        ub.NITI(dsp_offload=True, cpu_target="cortex-m4")
