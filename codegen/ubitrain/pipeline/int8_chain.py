"""The older, chain-only int8 pipeline: what precision="int8" runs for a
NITI(dsp_cache_bytes=...) of one's own until the int8 pipeline derived from the float graph
(int8.py) chunks the DSP's weight gradients by images. A model must be a chain of bias-free
convs and linears.

Lowering:
    niti_layers        the model as a chain of NITI layers (int8/lower.py, int8/onnx_lower.py)
      simd_kernels *   the int8 inner loops with the ISA's intrinsics
    int8_programs      the integer train_step and predict programs (int8/program.py)
    dsp_placement      on a DSP target: each kernel on the DSP or the CPU (int8/chain_placement.py)
    defer_dsp_updates  with dsp_offload: DSP weight updates late, beside CPU work
    plan_memory        one arena (memory/plan.py)
Finishing:
    check_budget       the arena against memory_budget (no recomputation in int8 yet)
    check_board        the plan against the board's SRAM and flash
    split_for_dsp      with dsp_offload: the step split into a CPU part and a DSP part
    write_project      the C project

(* a rewrite: `disable_passes` switches it off by name.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import CompileError
from ..int8.chain_placement import place_chain
from ..int8.lower import lower_module
from ..int8.onnx_lower import lower_onnx
from ..int8.package import Int8Package
from ..int8.program import build_int8_programs
from ..int8.trainable import freeze
from ..int8.update import NITI
from ..memory.plan import plan_memory
from ..niti.loss import MAX_CLASSES
from ..program.ir import Program
from ..project.emit import render_project
from ..project.manifest import write_manifest
from ..targets import check_board_fit, get_target
from .int8 import check_options, checked_optimizer
from .request import example_batch
from .steps import Pipeline, Rewrite, Step

TRACE, LOWER, PLAN, WRITE = ("trace and differentiate", "lower kernels", "plan memory",
                             "write C project")


@dataclass
class NitiParts:
    """What the int8 steps make beside the shared unit fields."""

    layers: object  # int8/layers.py LayerProgram
    config: NITI
    programs: object = None  # int8/program.py Int8Programs
    placement: list | None = None  # on a DSP target: DSP or CPU per train_step call
    order: list | None = None  # with dsp_offload: train_step's calls reordered
    kernels: list | None = None  # the C sources
    segments: list | None = None  # with dsp_offload: the DSP's methods
    overlaps: list | None = None  # CPU kernels run during each
    cpu_part: Program | None = None  # with dsp_offload: train_step's CPU part
    isa: str = "scalar"  # the int8 inner loops of the CPU part (or the whole step)
    dsp_isa: str = "scalar"  # and of the DSP part


def niti_layers(unit):
    r = unit.request
    x, labels = r.example_inputs[0], r.labels
    if len(r.example_inputs) != 1:
        raise CompileError(f"precision='int8' trains a model with one input; got "
                           f"{len(r.example_inputs)}")
    if not x.dtype.is_floating_point or labels.dim() != 1 or labels.shape[0] != x.shape[0] \
            or labels.dtype != torch.int64:
        raise CompileError("precision='int8' needs a float input batch and int64 class labels "
                           f"[batch]; got input {x.dtype} and labels {labels.dtype} "
                           f"{list(labels.shape)}")
    config = r.optimizer
    onnx = not isinstance(r.model, torch.nn.Module)
    lower = lower_onnx if onnx else lower_module
    layers = lower(r.model, x.float(), config.float_fallback)
    no_grad = frozenset() if onnx else frozenset(
        n for n, p in r.model.named_parameters() if not p.requires_grad)
    if r.trainable is not None or no_grad:
        freeze(layers, r.trainable, no_grad)
    if layers.classes > MAX_CLASSES:
        raise CompileError(f"precision='int8': {layers.classes} classes; the integer softmax "
                           f"gradient supports at most {MAX_CLASSES}")
    if config.dsp_offload and not unit.target.dsp:
        raise CompileError(f"NITI(dsp_offload=True) splits the step between a CPU and a DSP; "
                           f"target {unit.target.name!r} has no DSP: use a DSP target such as "
                           "'hexagon-v66'")
    unit.niti = NitiParts(layers, config)


def _cpu(unit):
    """A split step's CPU part runs where NITI.cpu_target says; else all on the target."""
    config = unit.niti.config
    return get_target(config.cpu_target) if config.dsp_offload else unit.target


def has_simd(unit) -> str | None:
    if _cpu(unit).kernel_isa("int8") == "scalar" and unit.target.kernel_isa("int8") == "scalar":
        return f"target {unit.target.name} has no int8 intrinsics"
    return None


def simd_kernels(unit):
    unit.niti.isa = _cpu(unit).kernel_isa("int8")
    unit.niti.dsp_isa = unit.target.kernel_isa("int8")


def _cache(unit) -> int | None:
    return unit.niti.config.dsp_cache_bytes if unit.target.dsp else None


def int8_programs(unit):
    n = unit.niti
    n.programs = build_int8_programs(n.layers, n.config, n.isa, _cache(unit))
    p = n.programs
    unit.train, unit.predict, unit.state, unit.opt_state = p.train, p.predict, p.state, \
        p.opt_state
    unit.inputs, unit.labels, unit.output = p.inputs, p.labels, p.output
    n.kernels = p.kernels


def dsp_placement(unit):
    if unit.target.dsp:
        unit.niti.placement = place_chain(unit.train)


def defer_dsp_updates(unit):
    n = unit.niti
    if not n.config.dsp_offload:
        return
    from ..offload.overlap import defer_weight_updates
    n.order = defer_weight_updates(unit.train, n.placement)
    unit.train = n.programs.train = Program(unit.train.name,
                                            [unit.train.calls[k] for k in n.order])
    n.placement = [n.placement[k] for k in n.order]


def memory_plan(unit):
    unit.plan = plan_memory([unit.train, unit.predict], alignment=unit.target.alignment)


def check_budget(unit):
    if unit.request.memory_budget is not None:
        from ..memory.budget import check_budget
        check_budget(unit.plan, unit.request.memory_budget)


def check_board(unit):
    check_board_fit(unit.target, unit.plan, unit.inputs, unit.labels, unit.output)


def split_for_dsp(unit):
    """The CPU part calls the DSP part's methods (offload/split.py), overlapped with the CPU
    kernels that do not touch their buffers (offload/overlap.py); the DSP part runs the same
    program built with the DSP's kernels, call for call."""
    n, r = unit.niti, unit.request
    if not n.config.dsp_offload:
        return
    from ..offload.split import kernel_statement, split_step
    full = unit.train
    dsp = build_int8_programs(n.layers, n.config, n.dsp_isa, _cache(unit))
    dsp_calls = [dsp.train.calls[k] for k in n.order]
    split = split_step(r.out_dir, r.name, full, n.placement, unit.plan,
                       lambda k: kernel_statement(dsp_calls[k].kernel, full.calls[k],
                                                  unit.plan), dsp.kernels)
    n.segments, n.overlaps, n.cpu_part = split.segments, split.overlaps, split.cpu_part
    n.kernels = n.kernels + [split.cpu_source]


def project(unit):
    n, r = unit.niti, unit.request
    train = n.cpu_part or unit.train
    render_project(r.out_dir, r.name, train, unit.predict, unit.plan, n.kernels,
                   unit.state, unit.opt_state, list(n.layers.weights), unit.inputs,
                   unit.labels, unit.output, n.layers.classes, target=r.target,
                   trace_calls=unit.trace_calls, example_batch=example_batch(r))


def package(unit):
    n, r, p = unit.niti, unit.request, unit.niti.programs
    unit.package = Int8Package(
        out_dir=r.out_dir, model_name=r.name, target=r.target, memory_plan=unit.plan,
        inputs=unit.inputs, labels=unit.labels, output=unit.output, classes=n.layers.classes,
        trainable=[c.weight for c in n.layers.convs() if c.trainable],
        programs={"train_step": unit.train, "predict": unit.predict,
                  "cpu_part": n.cpu_part or unit.train},
        kernel_count=len(p.kernels) - 2, layer_program=n.layers, config=n.config,
        integer_parameters=list(n.layers.weights),
        placement=n.placement, segments=n.segments, overlaps=n.overlaps)
    write_manifest(unit.package)  # package.json: the project loads without this process


INT8_CHAIN = Pipeline(
    "int8",
    lowering=(
        Step("niti_layers", niti_layers, "the model as a chain of NITI layers "
             "(int8/lower.py, int8/onnx_lower.py)", phase=TRACE),
        Rewrite("simd_kernels", simd_kernels, "the int8 inner loops (dot products, GEMMs, "
                "rescaling rows) with the ISA's intrinsics instead of plain C (int8/simd.py); "
                "integer sums are exact in any order", requires=has_simd),
        Step("int8_programs", int8_programs, "the integer train_step and predict programs "
             "(int8/program.py)", phase=LOWER),
        Step("dsp_placement", dsp_placement, "on a DSP target: each kernel on the DSP or the "
             "CPU (int8/chain_placement.py)"),
        Step("defer_dsp_updates", defer_dsp_updates, "with dsp_offload: the DSP's weight "
             "updates late, to run beside CPU kernels (offload/overlap.py)"),
        Step("plan_memory", memory_plan, "one arena (memory/plan.py)", phase=PLAN),
    ),
    finishing=(
        Step("check_budget", check_budget, "the arena against memory_budget "
             "(memory/budget.py)"),
        Step("check_board", check_board, "the plan against the board's SRAM and flash "
             "(targets/fit.py)"),
        Step("split_for_dsp", split_for_dsp, "with dsp_offload: the step split into a CPU "
             "part and a DSP part (offload/split.py)", phase=WRITE),
        Step("write_project", project, "model.h, model.c, CMakeLists.txt, runtime_c "
             "(project/emit.py)"),
        Step("package", package, "what the compile tells its caller (package.py), and "
             "package.json for a copy of the project (project/manifest.py)"),
    ),
    check_options=check_options,
    checked_optimizer=checked_optimizer,
)
