"""Placement of the int8 step on hexagon-v66 (the chain-only pipeline's, with dsp_offload):
the support table is obeyed and the MILP's placement is the cheapest under the cost model,
checked by enumerating every placement."""

import itertools

import pytest
import torch

import ubitrain as ub
from ubitrain.int8 import placement
from ubitrain.zoo import DigitsCNNNiti


def compile_for_hexagon(tmp_path, batch):
    torch.manual_seed(0)
    return ub.compile(DigitsCNNNiti(), (torch.randn(batch, 1, 8, 8),),
                      torch.randint(0, 10, (batch,)), precision="int8", target="hexagon-v66",
                      optimizer=ub.NITI(dsp_offload=True), out_dir=tmp_path / f"b{batch}")


@pytest.mark.parametrize("batch", [1, 32])
def test_placement_obeys_support_table_and_is_optimal(tmp_path, batch):
    pkg = compile_for_hexagon(tmp_path, batch)
    program, placed = pkg.programs["train_step"], pkg.placement
    for p in placed:
        if p.op not in placement.DSP_OPS:
            assert p.where == "cpu", p  # never sent to the DSP
    assert {p.op for p in placed if p.where == "cpu"} >= {"quantize", "softmax_xent_grad",
                                                           "max_pool_backward"}
    allowed = [i for i, p in enumerate(placed) if p.dsp_allowed]
    best = float("inf")
    for choice in itertools.product((False, True), repeat=len(allowed)):
        flags = [False] * len(placed)
        for i, on in zip(allowed, choice):
            flags[i] = on
        best = min(best, placement.step_cycles(program, flags))
    chosen = placement.step_cycles(program, [p.where == "dsp" for p in placed])
    assert chosen == pytest.approx(best)
    if batch == 32:  # big products: every convolution goes to HVX
        assert all(p.where == "dsp" for p in placed if p.op.startswith("conv2d"))
    report = placement.placement_report(placed, program)
    assert "kernels on the DSP" in report


def test_no_placement_off_hexagon(tmp_path):
    torch.manual_seed(0)
    pkg = ub.compile(DigitsCNNNiti(), (torch.randn(2, 1, 8, 8),), torch.tensor([1, 2]),
                     precision="int8", out_dir=tmp_path / "h")
    assert pkg.placement is None
