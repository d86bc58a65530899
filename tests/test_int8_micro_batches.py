"""precision="int8" over k micro-batches (niti/micro_batches.py): each micro-batch a NITI step
at its own exponents, the int32 gradients added at the coarser exponent with RoundShift.

* micro_batches=2 trains bit for bit as the numpy reference run micro-batch by micro-batch
  (fidelity/niti_micro_batches.py, from the model and k, not from the compiled graph): a
  plain conv net with biases, and the BatchNorm/depthwise/residual net with integer
  BatchNorm (batch statistics per micro-batch, running statistics moved per micro-batch)
  and adaptive rescaling; every parameter after every step, the running statistics,
  predict's output. The compile warns what differs from full-batch int8 training.
* A memory_budget no plan of the whole batch fits is met by the smallest k that fits; the
  plan printed in model.c is within it and the step is still the reference's.
* NITI(dsp_offload=True), whose split cuts a step without a loop, refuses micro-batches
  by name.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from emitted_plan import check_emitted_plan
from torch import nn

import ubitrain as ub
from tools.int8_models import MODELS, int8_batches
from ubitrain.fidelity.niti_check import compare_with_reference
from ubitrain.memory.budget import BudgetTooSmall

STEPS = 4


def _trains_as_reference(pkg, model, batches, config):
    with pkg.build() as trainer:
        run = compare_with_reference(trainer, model, [(x.numpy(), y.numpy())
                                                      for x, y in batches], config)
    assert run.differences == []
    assert run.moved > 0, "no parameter changed: the check would pass without training"
    return run


@pytest.mark.parametrize("make, batch_norm, adaptive", [
    (MODELS[1], "fold", False), (MODELS[4], "integer", True)],
    ids=["chain_with_biases", "integer_batch_norm_depthwise_residual_adaptive"])
def test_two_micro_batches_train_as_the_micro_batched_reference(make, batch_norm, adaptive,
                                                                 tmp_path):
    torch.manual_seed(0)
    model, batches = make(), int8_batches(STEPS)
    config = ub.NITI(mu=(5, 4), milestones=(2,), adaptive_rescale=adaptive, max_interval=4,
                     batch_norm=batch_norm)
    with pytest.warns(ub.UbitrainWarning, match=r"2 micro-batches of 2 samples.*maximum over "
                      r"one micro-batch.*coarsest of their exponents") as caught:
        pkg = ub.compile(model, *batches[0], precision="int8", optimizer=config,
                         micro_batches=2, out_dir=tmp_path / "mb", progress=False)
    said = " ".join(str(w.message) for w in caught)
    assert ("integer BatchNorm (stem.1, dw.1, pw.1)" in said) == (batch_norm == "integer")
    assert pkg.memory_plan.micro_batches == 2
    exponents = [b for b in pkg.memory_plan.buffers if b.name.endswith("_acc_exponent")]
    assert len(exponents) == len(pkg.trainable)  # one beside each gradient's sum
    run = _trains_as_reference(pkg, model, batches, config)
    assert (run.skipped > 0) == adaptive


def test_a_budget_only_micro_batches_meet_is_met_by_the_smallest_k(tmp_path):
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 1, 16, 16, generator=gen),
                torch.randint(0, 10, (8,), generator=gen)) for _ in range(2)]
    config = ub.NITI()
    with pytest.raises(BudgetTooSmall, match="with micro_batches=1") as whole_batch:
        ub.compile(model, *batches[0], precision="int8", optimizer=config, memory_budget=1,
                   micro_batches=1, out_dir=tmp_path / "k1", progress=False)
    budget = whole_batch.value.smallest_bytes - 1  # no plan of the whole batch fits this
    pkg = ub.compile(model, *batches[0], precision="int8", optimizer=config,
                     memory_budget=budget, out_dir=tmp_path / "mb", progress=False)
    plan = pkg.memory_plan
    assert plan.micro_batches == 2  # the smallest k that fits: the batch's closest exponents
    assert check_emitted_plan(pkg) == plan.arena_bytes <= budget
    assert plan.budget.micro_batches == 2 and plan.budget.accumulator_bytes > 0
    _trains_as_reference(pkg, model, batches, config)


def test_dsp_offload_refuses_micro_batches_by_name(tmp_path):
    model, batches = MODELS[0](), int8_batches(1)
    with pytest.raises(ub.CompileError, match=r"NITI\(dsp_offload=True\).*micro_batches=2.*"
                       r"use micro_batches=None or 1, or dsp_offload=False"):
        ub.compile(model, *batches[0], precision="int8", target="hexagon-v66",
                   optimizer=ub.NITI(dsp_offload=True), micro_batches=2,
                   out_dir=tmp_path / "dsp", progress=False)
