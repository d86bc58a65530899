"""The int8 step derived from the float graph (pipeline/int8.py), compiled to C and
trained on the host and on every cross target under QEMU, against NITI's numpy reference
read off the model's ATen graph with NITI's update rule (fidelity/niti_check.py): every
integer parameter after every step, the losses and predict's output, bit for bit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from harness import CROSS, require_tools

import ubitrain as ub
from tools.int8_models import MODEL_IDS, MODELS, TableActivations, int8_batches
from ubitrain.fidelity.niti_check import compare_with_reference

STEPS = 4
CASES = [(make, "counted") for make in MODELS] + [(MODELS[2], "adaptive"),
                                                  (MODELS[4], "adaptive")]
CASE_IDS = MODEL_IDS + [f"{MODEL_IDS[2]}-adaptive", f"{MODEL_IDS[4]}-adaptive"]


@pytest.mark.parametrize("make,rescaling", CASES, ids=CASE_IDS)
def test_the_compiled_int8_step_trains_as_the_numpy_reference(make, rescaling, tmp_path):
    """Counted: every site reduces each step. Adaptive: sites skip reductions (intervals
    learned up to 4 steps), the reference keeping its own sites."""
    assert_trains_as_reference(make, rescaling, "host", tmp_path).close()


@pytest.mark.parametrize("rescaling", ["counted", "adaptive"])
def test_an_integer_batch_norm_trains_as_the_numpy_reference(rescaling, tmp_path):
    """NITI(batch_norm="integer"): the three BatchNorms with batch statistics
    (niti/batch_norm.py), not folded; their running statistics after every step and predict
    with them, bit for bit too."""
    assert_trains_as_reference(MODELS[4], rescaling, "host", tmp_path,
                               batch_norm="integer").close()


def test_weights_with_an_exponent_per_channel_train_as_the_numpy_reference(tmp_path):
    """NITI(weight_exponents="channel") (niti/channel_exponents.py): each output channel of
    a conv or linear weight its own exponent; the folded BatchNorms spread them. The
    float parameters load back to the same integers."""
    trainer = assert_trains_as_reference(MODELS[4], "counted", "host", tmp_path,
                                         weight_exponents="channel")
    state = trainer.int8_parameters()
    spread = [n for n in state if n.endswith(".exponent") and len(set(state[n])) > 1]
    assert spread, "every channel got the same exponent: the test would not see per-channel"
    trainer.load_parameters(trainer.parameters())
    after = trainer.int8_parameters()
    assert all(np.array_equal(state[n], after[n]) for n in state)
    trainer.close()


@pytest.mark.parametrize("target", CROSS)
def test_on_every_cross_target_too(target, tmp_path):
    """The same C built by the target's cross compiler and run under QEMU, its count of
    completed steps set first as a fleet's client sets it (the mu schedule goes on from
    there). The integer BatchNorm: its kernels, and the biases (conv and beta) folding
    would give."""
    require_tools(target)
    assert_trains_as_reference(MODELS[4], "adaptive", target, tmp_path, first_step=1,
                               batch_norm="integer").close()


def test_table_functions_train_as_the_numpy_reference(tmp_path):
    """Hardswish, Hardsigmoid, SiLU, Sigmoid, Tanh and GELU (both forms) by compile-time
    table (niti/tables.py), forward and backward, with adaptive rescaling."""
    assert_trains_as_reference(TableActivations, "adaptive", "host", tmp_path).close()


def test_frozen_per_channel_weights_are_read_at_one_exponent_from_flash(tmp_path):
    """On a board, where frozen weights stay in flash, the backward's copy of a frozen
    per-channel weight at its coarsest exponent is made at compile time (a constant in flash),
    not in the arena every step; only the trained weights' copies are left to the step, which
    is still the reference's bit for bit."""
    require_tools("cortex-m4")
    rule = ub.SparseUpdate(biases=True, last_layers=1)
    trainer = assert_trains_as_reference(MODELS[4], "counted", "cortex-m4", tmp_path,
                                         weight_exponents="channel", trainable=rule)
    copies = [c for c in trainer.package.programs["train_step"].calls
              if "weight_at_coarsest" in c.kernel]
    trainer.close()
    assert copies, "no trained per-channel weight: the test would not see the step's copies"
    assert all(any(a.root.kind == "parameter" for a in c.reads) for c in copies)
    host = ub.compile(MODELS[4](), *int8_batches(1)[0], precision="int8", trainable=rule,
                      optimizer=ub.NITI(weight_exponents="channel"), out_dir=tmp_path / "host",
                      progress=False)
    on_host = [c for c in host.programs["train_step"].calls if "weight_at_coarsest" in c.kernel]
    assert len(on_host) > len(copies), "no frozen weight on the backward path to fold"


def assert_trains_as_reference(make, rescaling, target, tmp_path, first_step=0,
                               batch_norm="fold", weight_exponents="tensor", trainable=None):
    """The trainer after STEPS steps checked against the reference (the caller closes it)."""
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, batches = make(), int8_batches(STEPS)
    config = ub.NITI(mu=(5, 4), milestones=(2,),  # the schedule changes inside the run
                     adaptive_rescale=rescaling == "adaptive", max_interval=4,
                     batch_norm=batch_norm, weight_exponents=weight_exponents)
    pkg = ub.compile(model, (batches[0][0],), batches[0][1], precision="int8",
                     optimizer=config, target=target, out_dir=tmp_path / "net", progress=False,
                     trainable=trainable)
    trainer = pkg.build()
    trainer.reset_optimizer_state(step=first_step)
    run = compare_with_reference(trainer, model, [(x.numpy(), y.numpy()) for x, y in batches],
                                 config, first_step)
    steps = trainer.steps
    assert run.differences == []
    assert steps == first_step + STEPS
    assert run.moved > 0, "no parameter changed: the check would pass without training"
    assert (run.skipped > 0) == (rescaling == "adaptive"), run.skipped
    return trainer


def test_a_memory_budget_is_fitted_and_trains_the_same(tmp_path):
    """A budget below the arena: activations recomputed or paged (each recomputed call reads
    the rescale sites as the first run did), the step still the reference's bit for bit; a
    budget no plan fits is refused with the numbers."""
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, batches = MODELS[4](), int8_batches(STEPS)
    config = ub.NITI(mu=(5,), milestones=(), adaptive_rescale=True, max_interval=4)
    x, y = batches[0]
    free = ub.compile(model, (x,), y, precision="int8", optimizer=config,
                      out_dir=tmp_path / "free", progress=False)
    budget = int(free.memory_plan.arena_bytes * 0.85)
    fitted = ub.compile(model, (x,), y, precision="int8", optimizer=config, progress=False,
                        memory_budget=budget, out_dir=tmp_path / "fitted")
    assert fitted.memory_plan.arena_bytes <= budget < free.memory_plan.arena_bytes
    assert fitted.memory_plan.micro_batches == 1  # the whole batch fits: its exponents kept
    run = compare_with_reference(fitted.build(), model, [(a.numpy(), b.numpy())
                                                         for a, b in batches], config)
    assert run.differences == [] and run.moved > 0
    with pytest.raises(ub.CompileError, match="memory_budget"):
        ub.compile(model, (x,), y, precision="int8", optimizer=config, progress=False,
                   memory_budget=1024, out_dir=tmp_path / "small")
