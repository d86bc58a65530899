"""The int8 step split between the CPU (host, or aarch64-neon under qemu-aarch64) and the DSP
(hexagon-v66 under qemu-hexagon), joined by the offload interface over pipes (the chain-only
pipeline, pipeline/int8_chain.py): bit for bit its numpy reference, also with the
weight-gradient convs split by images. A missing toolchain skips locally and fails in CI
(CI=true)."""

import numpy as np
import pytest
import torch
from harness import require_tools
from niti_harness import check_chain_against_reference

import ubitrain as ub
from ubitrain.zoo import DigitsCNNNiti

STEPS = 3


def test_split_step_equals_the_reference(tmp_path):
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


def test_split_step_with_cpu_part_under_qemu_aarch64(tmp_path):
    """The Android setting: the CPU part built for aarch64-neon (NEON kernels) runs under
    qemu-aarch64, the DSP part under qemu-hexagon, the two emulators joined by FIFOs, CPU
    kernels running while the DSP works on a segment; several steps in one pair of emulator
    processes, bit for bit the numpy reference."""
    require_tools("hexagon-v66")
    require_tools("aarch64-neon")
    gen = np.random.default_rng(1)
    data = [(gen.standard_normal((8, 1, 8, 8)).astype(np.float32), gen.integers(0, 10, 8))
            for _ in range(4)]
    x, y = torch.from_numpy(data[0][0]), torch.from_numpy(data[0][1])
    torch.manual_seed(1)
    model = DigitsCNNNiti()
    common = dict(mu=(5, 4), milestones=(2,), adaptive_rescale=True, max_interval=2)
    split = ub.compile(model, (x,), y, precision="int8", target="hexagon-v66",
                       optimizer=ub.NITI(dsp_offload=True, cpu_target="aarch64-neon", **common),
                       out_dir=tmp_path / "split")
    assert "__neon" in (tmp_path / "split" / "model.c").read_text()  # the Android CPU's kernels
    # the DSP's weight updates run while the CPU part computes the first layers' errors
    assert any(ov.kernels for ov in split.overlaps)
    check_chain_against_reference(split, data, split.config)


def test_cpu_target_must_be_a_cpu():
    with pytest.raises(ub.CompileError, match="cpu_target='cortex-m4'.*host, aarch64-neon"):
        ub.NITI(dsp_offload=True, cpu_target="cortex-m4")
