"""`ub.compile`: a model, a loss, an optimizer and a target in; a C training project out.

The compile is one declared pipeline per precision (pipeline/fp32.py, pipeline/int8.py):
its lowering steps run once per number of micro-batches, then its finishing steps once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UbitrainError
from .int8.package import Int8Package
from .int8.update import NITI
from .memory.plan import MemoryPlan
from .package import Package
from .program.ir import Slot
from .progress import Steps
from .project.manifest import read_manifest
from .targets import get_target

if TYPE_CHECKING:
    from .pipeline.unit import Unit

# The pipeline (pipeline/) is imported by the functions that run it: it imports torch and
# TVM, seconds that load_package (a trainer of a compiled project: a fleet client's process)
# does not need.

COMPILE_STEPS = ["trace and differentiate", "lower kernels", "plan memory", "write C project"]


def compile(model, example_inputs, labels, loss: str = "cross_entropy", optimizer=None,
            trainable=None, target: str = "host", precision: str = "fp32",
            memory_budget=None, out_dir="build/model", progress: bool | None = None,
            micro_batches: int | None = None, disable_passes=(), instruments=(),
            name: str | None = None) -> Package:
    """Compile `model`'s training step for `target` into a C project in `out_dir`.

    `progress`: a bar on stderr over the compile steps (None: when stderr is a terminal).
    `micro_batches=k` runs each step as k micro-batches of batch/k samples with gradient
    accumulation (program/micro_batch.py); None lets a `memory_budget` choose k, else 1.
    `disable_passes`: names of rewrite passes to switch off (`ubitrain passes` lists them;
    pipeline/fp32.py declares them), for debugging: the step trains the same, bit for bit
    for the passes that claim it. `instruments`: pipeline/instruments.py Instruments that
    watch every step. `name`: the C prefix (ub_<name>_step); by default out_dir's name."""
    from .pipeline import pipeline_for, run_steps
    from .pipeline.request import checked_request

    start = time.perf_counter()
    pipeline = pipeline_for(precision, target)
    disabled = pipeline.disabled(disable_passes)
    request = checked_request(pipeline, model, example_inputs, labels, loss, optimizer,
                              trainable, target, memory_budget, out_dir, micro_batches, name)
    lower = _lowering(pipeline, request, disabled, instruments)
    with Steps("ubitrain compile", COMPILE_STEPS, progress) as step:
        unit = lower(request.micro_batches or 1, step)
        unit = run_steps(pipeline.finishing, unit, step)
    unit.package.compile_seconds = time.perf_counter() - start
    return unit.package


def lower(model, example_inputs, labels, loss: str = "cross_entropy", optimizer=None,
          trainable=None, target: str = "host", precision: str = "fp32",
          micro_batches: int = 1, disable_passes=()) -> Unit:
    """The pipeline's lowering steps alone, at `micro_batches`: the unit with its training
    module, kernel library, step programs and memory plan, and no project written (for
    tools and tests that study the step)."""
    from .pipeline import pipeline_for
    from .pipeline.request import checked_request

    pipeline = pipeline_for(precision, target)
    request = checked_request(pipeline, model, example_inputs, labels, loss, optimizer,
                              trainable, target, None, ".", micro_batches)
    return _lowering(pipeline, request, pipeline.disabled(disable_passes), ())(micro_batches)


def _lowering(pipeline, request, disabled, instruments):
    from .pipeline import run_steps
    from .pipeline.unit import Unit

    def lower(k: int, progress=None) -> Unit:
        """The lowering steps at k micro-batches (a budget may ask for another k)."""
        unit = Unit(request, k, disabled, tuple(instruments), lower)
        return run_steps(pipeline.lowering, unit, progress)
    return lower


def load_package(out_dir):
    """The Package of the project in `out_dir` (its package.json, written by ub.compile),
    ready to `build()`: on the host, CMake builds it there and loads it; for a cross
    target, its driver runs under the target's emulator."""
    out_dir = Path(out_dir).resolve()
    data = read_manifest(out_dir)

    def slot(d, kind):
        return Slot(d["name"], tuple(d["shape"]), d["dtype"], kind,
                    index_bound=d.get("index_bound"))

    plan = data["memory_plan"]
    common = dict(
        out_dir=out_dir, model_name=data["model_name"], target=get_target(data["target"]),
        memory_plan=MemoryPlan(plan["arena_bytes"], plan["lower_bound_bytes"],
                               plan["persistent_bytes"], plan["alignment"],
                               micro_batches=plan.get("micro_batches", 1)),
        inputs=[slot(d, "input") for d in data["inputs"]], labels=slot(data["labels"], "label"),
        output=slot(data["output"], "output"), classes=data["classes"],
        trainable=list(data["trainable"]), kernel_count=data.get("kernel_count", 0),
        frozen_in_flash=list(data["frozen_in_flash"]), aliases=dict(data["aliases"]),
        pages=data["pages"], manifest=data)
    if data["precision"] == "int8":
        int8 = data["int8"]
        if int8["dsp_offload"]:
            raise UbitrainError(f"{out_dir}: this int8 project splits its step between a CPU "
                               "and a Hexagon DSP (NITI(dsp_offload=True)); load_package does "
                               "not rebuild the split: use the Package ub.compile returned")
        niti = {k: tuple(v) if isinstance(v, list) else v for k, v in int8["niti"].items()}
        package = Int8Package(**common, config=NITI(**niti),
                              integer_parameters=list(int8["parameters"]))
    else:
        package = Package(**common)
    return package
