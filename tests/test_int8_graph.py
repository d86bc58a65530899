"""The int8 step derived from the float graph (pipeline/int8_graph.py), compiled to C and
trained on the host and on every cross target under QEMU, against NITI's numpy reference
read off the model's ATen graph with NITI's update rule (fidelity/niti_check.py): every
integer parameter after every step, the losses and predict's output, bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch
from harness import CROSS, require_tools

import ubitrain as ub
from tools.int8_models import MODEL_IDS, MODELS, int8_batches
from ubitrain.api import compile_with
from ubitrain.fidelity.niti_check import compare_with_reference
from ubitrain.pipeline.int8_graph import INT8_GRAPH

STEPS = 4
CASES = [(make, "counted") for make in MODELS] + [(MODELS[2], "adaptive"),
                                                  (MODELS[4], "adaptive")]
CASE_IDS = MODEL_IDS + [f"{MODEL_IDS[2]}-adaptive", f"{MODEL_IDS[4]}-adaptive"]


@pytest.mark.parametrize("make,rescaling", CASES, ids=CASE_IDS)
def test_the_compiled_int8_step_trains_as_the_numpy_reference(make, rescaling, tmp_path):
    """Counted: every site reduces each step. Adaptive: sites skip reductions (intervals
    learned up to 4 steps), the reference keeping its own sites."""
    assert_trains_as_reference(make, rescaling, "host", tmp_path)


@pytest.mark.parametrize("target", CROSS)
def test_on_every_cross_target_too(target, tmp_path):
    """The same C built by the target's cross compiler and run under QEMU."""
    require_tools(target)
    assert_trains_as_reference(MODELS[4], "adaptive", target, tmp_path)


def assert_trains_as_reference(make, rescaling, target, tmp_path):
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model, batches = make(), int8_batches(STEPS)
    config = ub.NITI(mu=(5, 4), milestones=(2,),  # the schedule changes inside the run
                     adaptive_rescale=rescaling == "adaptive", max_interval=4)
    pkg = compile_with(INT8_GRAPH, model, (batches[0][0],), batches[0][1], "cross_entropy",
                       config, None, target, None, tmp_path / "net", False, None, (), (), None)
    run = compare_with_reference(pkg.build(), model, [(x.numpy(), y.numpy())
                                                      for x, y in batches], config)
    assert run.differences == []
    assert run.moved > 0, "no parameter changed: the check would pass without training"
    assert (run.skipped > 0) == (rescaling == "adaptive"), run.skipped
