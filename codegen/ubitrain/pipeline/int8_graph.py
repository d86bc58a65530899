"""The int8 (NITI) pipeline derived from the float one: the float steps, with the training
module made integer right after it is traced. It is the successor of int8.py's chain-only
pipeline and not yet what precision="int8" runs (host C, exact rescaling; see docs/int8.md).

Lowering:
    fold_batch_norm       each BatchNorm folded into the layer before it
                          (training/batch_norm_folding.py)
    trace                 the model traced, its loss appended, differentiated (Relax)
    niti_graph            the functions and state made NITI's integer ones
                          (training/niti_module.py, training/niti_graph.py)
    kernel_library        where each kernel is printed once
    legalize_fused_ops    NITI's integer ops (lowering/niti_kernels.py) as TIR
    legalize              every other Relax op as a TIR PrimFunc
      fuse_kernels *      elementwise chains fused
    state_slots           integer parameters, their exponents, the rescale sites
    train_calls           the training function walked into calls
    optimizer_updates     NITI's update per trained parameter
      early_updates *     each update right after its last use
    finish_train          the train_step program
    predict               the evaluation-mode forward (exact rescaling)
    plan_memory           one arena
Finishing:
    check_budget, check_board, write_project, package: as int8.py's and fp32.py's
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import CompileError
from ..niti.rescale import ADAPTIVE, EXACT_COUNTED
from ..training.batch_norm_folding import fold_batch_norms
from ..training.niti_module import niti_training_module
from . import fp32, int8
from .steps import Pipeline, Rewrite, Step


def fold_batch_norm(unit):
    r = unit.request
    if isinstance(r.model, torch.nn.Module):
        unit.request = dataclasses.replace(r, model=fold_batch_norms(r.model))


def niti_graph(unit):
    r, config = unit.request, unit.request.optimizer
    if config.float_fallback or config.dsp_offload:
        raise CompileError("NITI(float_fallback=, dsp_offload=) are not in the graph-derived "
                           "int8 pipeline yet")
    if len(r.example_inputs) != 1:
        raise CompileError(f"precision='int8' trains a model with one input; got "
                           f"{len(r.example_inputs)}")
    mode = ADAPTIVE if config.adaptive_rescale else EXACT_COUNTED
    unit.tm = niti_training_module(unit.tm, r.model, r.example_inputs[0], mode,
                                   config.max_interval)


INT8_GRAPH = Pipeline(
    "int8",
    lowering=(
        Step("fold_batch_norm", fold_batch_norm, "each BatchNorm folded into the conv or "
             "linear before it, with its running statistics (training/batch_norm_folding.py)",
             phase=fp32.TRACE),
        Step("trace", fp32.trace, "the model traced, its loss appended and differentiated "
             "(training/graph.py)"),
        Step("niti_graph", niti_graph, "the training module made NITI's integer one "
             "(training/niti_module.py)"),
        Step("kernel_library", fp32.kernel_library, "the kernels, each printed once "
             "(kernels/library.py)", phase=fp32.LOWER),
        Step("legalize_fused_ops", fp32.fused_ops_as_tir, "NITI's integer ops as TIR "
             "(lowering/niti_kernels.py)"),
        Step("legalize", fp32.legalize, "every other Relax op as a TIR PrimFunc "
             "(lowering/legalize.py)"),
        Rewrite("fuse_kernels", fp32.fused_kernels, "elementwise chains fused into one kernel "
                "(lowering/fusion.py)"),
        Step("state_slots", fp32.slots_of_state, "integer parameters, exponents and rescale "
             "sites as slots (program/state_slots.py)"),
        Step("train_calls", fp32.walk_train, "the training function walked into calls "
             "(program/train_step.py)"),
        Step("optimizer_updates", fp32.add_optimizer_updates, "NITI's update per trained "
             "parameter (program/optimizer_update.py)"),
        Rewrite("early_updates", fp32.updates_early, "each update right after the last use "
                "of its parameter and gradient (program/optimizer_update.py)",
                requires=fp32.has_updates),
        Step("finish_train", fp32.finish_train, "the train_step program"),
        Step("predict", fp32.walk_predict, "the evaluation-mode forward "
             "(program/predict_step.py)"),
        Step("plan_memory", fp32.memory_plan, "one arena (memory/plan.py)", phase=fp32.PLAN),
    ),
    finishing=(
        Step("check_budget", int8.check_budget, "the arena against memory_budget "
             "(memory/budget.py)"),
        Step("check_board", fp32.check_board, "the plan against the board's SRAM and flash "
             "(targets/fit.py)", phase=fp32.WRITE),
        Step("write_project", fp32.project, "model.h, model.c, CMakeLists.txt, runtime_c "
             "(project/emit.py)"),
        Step("package", fp32.package, "what the compile tells its caller (package.py)"),
    ),
    check_options=int8.check_options,
    checked_optimizer=int8.checked_optimizer,
)
