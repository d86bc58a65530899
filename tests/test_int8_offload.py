"""The int8 step split between the CPU (host, or aarch64-neon under qemu-aarch64) and the DSP
(hexagon-v66 under qemu-hexagon), joined by the offload interface over pipes: bit for bit
NITI's numpy reference (fidelity/niti_check.py) on a net with biases, BatchNorm, a depthwise
conv and a residual add. A missing toolchain skips locally and fails in CI (CI=true)."""

import numpy as np
import pytest
import torch
from harness import require_tools
from niti_harness import check_against_reference

import ubitrain as ub
from tools.int8_models import MODELS

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


def test_cpu_target_must_be_a_cpu():
    with pytest.raises(ub.CompileError, match="cpu_target='cortex-m4'.*host, aarch64-neon"):
        ub.NITI(dsp_offload=True, cpu_target="cortex-m4")
