"""Placement of the int8 step on hexagon-v66 (offload/placement.py): what the DSP may not run
stays on the CPU, and the MILP's placement is the cheapest under the cost model, checked by
enumerating every placement of a part of the step."""

import itertools

import pytest
import torch

import ubitrain as ub
from ubitrain.offload import placement
from ubitrain.zoo import DigitsCNNNiti

FREE = 10  # calls the enumeration places freely: 2^10 placements


def compile_for_hexagon(tmp_path, batch):
    torch.manual_seed(0)
    return ub.compile(DigitsCNNNiti(), (torch.randn(batch, 1, 8, 8),),
                      torch.randint(0, 10, (batch,)), precision="int8", target="hexagon-v66",
                      optimizer=ub.NITI(dsp_offload=True), out_dir=tmp_path / f"b{batch}",
                      progress=False)


@pytest.mark.parametrize("batch", [1, 32])
def test_placement_obeys_what_the_dsp_may_run(tmp_path, batch):
    pkg = compile_for_hexagon(tmp_path, batch)
    program, placed = pkg.programs["train_step"], pkg.placement
    for call, p in zip(program.calls, placed):
        if call.builtin or any(a.root.external for a in call.args):
            assert not p.dsp_allowed and p.where == "cpu", p  # never sent to the DSP
    assert any("quantize" in p.kernel for p in placed if p.where == "cpu")
    if batch == 32:  # big products: every convolution goes to HVX
        assert all(p.where == "dsp" for p in placed if "conv2d" in p.kernel)
    assert "kernels on the DSP" in placement.placement_report(placed, program)


def test_the_milp_finds_the_cheapest_placement(tmp_path):
    """The first FREE calls the DSP may run are left free, every other call on the CPU:
    the MILP's placement costs what the cheapest of all 2^FREE does."""
    pkg = compile_for_hexagon(tmp_path, 32)
    program = pkg.programs["train_step"]
    free = [c for c in program.calls if placement.dsp_may_run(c)][:FREE]
    compiled = {id(c): (p.cpu_cycles, p.dsp_cycles) for c, p in zip(program.calls,
                                                                      pkg.placement)}
    placed = placement.place(program, lambda call: compiled[id(call)],
                             lambda call: any(call is c for c in free))
    chosen = placement.step_cycles(program, placed, [p.where == "dsp" for p in placed])
    index = [k for k, c in enumerate(program.calls) if any(c is f for f in free)]
    best = float("inf")
    for choice in itertools.product((False, True), repeat=len(index)):
        flags = [False] * len(placed)
        for k, on in zip(index, choice):
            flags[k] = on
        best = min(best, placement.step_cycles(program, placed, flags))
    assert sum(p.where == "dsp" for p in placed) > 0
    assert chosen == pytest.approx(best)


def test_no_placement_off_hexagon(tmp_path):
    torch.manual_seed(0)
    pkg = ub.compile(DigitsCNNNiti(), (torch.randn(2, 1, 8, 8),), torch.tensor([1, 2]),
                     precision="int8", out_dir=tmp_path / "h", progress=False)
    assert pkg.placement is None
