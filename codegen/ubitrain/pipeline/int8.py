"""The int8 (NITI) pipeline, precision="int8": the float pipeline's steps, with the training
module made integer right after it is traced (docs/int8.md).

Lowering:
    fold_batch_norm       each BatchNorm folded into the layer before it
                          (training/batch_norm_folding.py)
    integer_ops           every op one with an integer form (training/niti_ops.py)
    trace                 the model traced, its loss appended, differentiated (Relax)
    niti_graph            the functions and state made NITI's integer ones
                          (training/niti_module.py, training/niti_graph.py and its rules)
    kernel_library        where each kernel is printed once
    legalize_fused_ops    NITI's integer ops (lowering/niti_kernels.py) as TIR
    legalize              every other Relax op as a TIR PrimFunc
      fuse_kernels *      elementwise chains fused
    state_slots           integer parameters, their exponents, the rescale sites
    train_calls           the training function walked into calls
    micro_batch_loop      with k > 1, the calls as a loop body whose gradients add up at
                          one exponent (program/niti_micro_batch.py)
    optimizer_updates     NITI's update per trained parameter
      early_updates *     each update right after its last use
    finish_train          the train_step program
    predict               the evaluation-mode forward (exact rescaling)
      share_in_place *    elementwise outputs over inputs that die there
    frozen_state_in_flash on a board: state no step writes as const data in flash
      fold_frozen_calls *   kernels over frozen weights evaluated at compile time (a
                            per-channel weight at its coarsest exponent, for the backward)
    plan_memory           one arena
Finishing:
    fit_memory_budget     recompute, page or micro-batch to fit a budget
    dsp_placement         on a DSP target: each call on the DSP or the CPU
                          (offload/placement.py)
    check_board           as fp32.py's
    split_for_dsp         with NITI(dsp_offload=True): the step cut into a CPU part and a
                          DSP part (offload/split.py)
    write_project, package: as fp32.py's

(* a rewrite: `disable_passes` switches it off by name.)
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import CompileError
from ..int8.package import Int8Package
from ..int8.update import NITI
from ..memory.cost_model import KernelWork
from ..memory.micro_batching import fit_micro_batched
from ..niti.loss import MAX_CLASSES
from ..niti.rescale import ADAPTIVE, EXACT_COUNTED
from ..offload.placement import cycles, place
from ..offload.split import split_step
from ..ops.table_activation import TABLE_CONVERTERS
from ..program.niti_micro_batch import aligned_sums
from ..project.manifest import write_manifest
from ..training.batch_coupling import one_batch_dimension, warn_integer_micro_batches
from ..training.batch_norm_folding import (
    batch_norm_mode,
    batch_norms,
    fold_batch_norms,
    weight_exponents_mode,
)
from ..training.niti_module import niti_training_module
from ..training.niti_ops import check_integer_onnx_ops, check_integer_ops
from . import fp32
from .steps import Pipeline, Rewrite, Step


def fold_batch_norm(unit):
    """NITI(batch_norm="auto", weight_exponents="auto") made the modes they mean for this
    model (the package's config says which); "fold" folds."""
    r = unit.request
    mode = batch_norm_mode(r.optimizer.batch_norm, r.model)
    config = dataclasses.replace(r.optimizer, batch_norm=mode, weight_exponents=(
        weight_exponents_mode(r.optimizer.weight_exponents, mode, r.model)))
    model = fold_batch_norms(r.model) if mode == "fold" and isinstance(
        r.model, torch.nn.Module) else r.model
    unit.request = dataclasses.replace(r, optimizer=config, model=model)


def trace(unit):
    """fp32's trace, with the functions NITI computes by table (niti/tables.py) as one op
    each way (ops/table_activation.py)."""
    fp32.trace(unit, TABLE_CONVERTERS)


def integer_ops(unit):
    r = unit.request
    if isinstance(r.model, torch.nn.Module):
        check_integer_ops(r.model, r.example_inputs, r.optimizer.batch_norm == "integer")
    else:  # an ONNX model (api.py admits no other)
        check_integer_onnx_ops(r.model)


def niti_graph(unit):
    r, config = unit.request, unit.request.optimizer
    if len(r.example_inputs) != 1:
        raise CompileError(f"precision='int8' trains a model with one input; got "
                           f"{len(r.example_inputs)}")
    x, labels = r.example_inputs[0], r.labels
    if not x.dtype.is_floating_point or labels.dim() != 1 or labels.shape[0] != x.shape[0] \
            or labels.dtype != torch.int64:
        raise CompileError("precision='int8' needs a float input batch and int64 class labels "
                           f"[batch]; got input {x.dtype} and labels {labels.dtype} "
                           f"{list(labels.shape)}")
    if config.dsp_offload and not unit.target.dsp:
        raise CompileError(f"NITI(dsp_offload=True) splits the step between a CPU and a DSP; "
                           f"target {unit.target.name!r} has no DSP: use a DSP target such as "
                           "'hexagon-v66'")
    if config.dsp_offload and unit.micro_batches > 1:  # the split cuts a flat call list
        raise CompileError(f"NITI(dsp_offload=True) splits a step without micro-batches; "
                           f"micro_batches={unit.micro_batches} makes a loop of it: use "
                           "micro_batches=None or 1, or dsp_offload=False")
    if not unit.tm.trainable:
        names = ", ".join(s.name for s in unit.tm.graph.state if s.is_parameter)
        raise CompileError(f"trainable={r.trainable!r} selects no parameter to train, and "
                           f"precision='int8' trains at least one: name at least one of {names}")
    classes = int(unit.tm.predict_graph.output.ty.shape[-1])
    if classes > MAX_CLASSES:
        raise CompileError(f"precision='int8': {classes} classes; the integer softmax "
                           f"gradient supports at most {MAX_CLASSES}")
    mode = ADAPTIVE if config.adaptive_rescale else EXACT_COUNTED
    unit.tm = niti_training_module(unit.tm, r.model, x, mode, config.max_interval,
                                   config.weight_exponents == "channel")


def micro_batch_loop(unit):
    """fp32's loop, the gradients summed at one exponent (niti/micro_batches.py). The
    rescale sites are buffers the step updates, so the loop runs them through shadows as
    BatchNorm's statistics: each micro-batch reads the sites as the one before left them."""
    fp32.micro_batch_loop(unit, aligned_sums)


def fit_memory_budget(unit):
    """fp32's fit: keep, recompute, page or micro-batch. Micro-batches change the integer
    step (each takes its own exponents), so, as for a model with BatchNorm in fp32, k > 1 is
    tried only when no plan of the whole batch fits, and then the smallest k that fits. A
    recomputed call reads the rescale sites as they were at the start of its (micro-)batch
    (their new values are copied back at its end), so it rescales as the first run did."""
    r = unit.request
    if r.memory_budget is not None:
        unit, unit.train, unit.plan = fit_micro_batched(
            unit, unit.lower, r.memory_budget, r.target, r.batch, r.micro_batches,
            coupled=True, splittable=one_batch_dimension(r.example_inputs, r.labels))
    integer = r.optimizer.batch_norm == "integer" and isinstance(r.model, torch.nn.Module)
    warn_integer_micro_batches(unit.micro_batches, r.batch,
                               batch_norms(r.model) if integer else [])
    return unit


def dsp_placement(unit):
    if unit.target.dsp:
        work = KernelWork(unit.library)
        unit.placement = place(unit.train, lambda call: cycles(work(call), call))


def split_for_dsp(unit):
    r = unit.request
    if r.optimizer.dsp_offload:
        unit.split = split_step(r.out_dir, r.name, unit.train, unit.placement, unit.plan,
                                unit.library)


def project(unit):
    if unit.split is None:
        return fp32.project(unit)
    return fp32.project(unit, unit.split.cpu_part, [unit.split.cpu_source])


def package(unit):
    r, tm, split = unit.request, unit.tm, unit.split
    programs = {"train_step": unit.train, "predict": unit.predict}
    if split is not None:
        programs["cpu_part"] = split.cpu_part
    unit.package = Int8Package(
        out_dir=r.out_dir, model_name=r.name, target=r.target, memory_plan=unit.plan,
        inputs=unit.inputs, labels=unit.labels, output=unit.output,
        classes=unit.output.shape[-1], trainable=tm.trainable,
        programs=programs, kernel_count=len(unit.library.kernels),
        frozen_in_flash=list(unit.frozen), skipped_passes=dict(unit.skipped),
        config=r.optimizer, integer_parameters=[s.name for s in tm.predict_graph.state
                                                     if s.is_parameter],  # weights whole
        pages=fp32.paged_tensors(unit), placement=unit.placement,
        segments=split.segments if split else None,
        overlaps=split.overlaps if split else None)
    write_manifest(unit.package)  # package.json: the project loads without this process


def checked_optimizer(optimizer):
    config = optimizer if optimizer is not None else NITI()
    if not isinstance(config, NITI):
        raise CompileError(f"precision='int8' updates weights with NITI's integer rule, not "
                           f"{type(config).__name__} (no learning rate or momentum in int8); "
                           "pass optimizer=ub.NITI(mu=(5, 4, 3), milestones=(...)) or None")
    return config


def check_options(loss, micro_batches):
    if loss != "cross_entropy":
        raise CompileError(f"precision='int8' trains with NITI's integer softmax cross-entropy; "
                           f"loss={loss!r} has no integer form: use loss='cross_entropy'")


INT8 = Pipeline(
    "int8",
    lowering=(
        Step("fold_batch_norm", fold_batch_norm, "each BatchNorm folded into the conv or "
             "linear before it, with its running statistics (training/batch_norm_folding.py)",
             phase=fp32.TRACE),
        Step("integer_ops", integer_ops, "every op of the model one with an integer form, "
             "or an error naming those without (training/niti_ops.py)"),
        Step("trace", trace, "the model traced, its loss appended and differentiated "
             "(training/graph.py); GELU, Sigmoid, Tanh, SiLU, Hardswish and Hardsigmoid as "
             "table ops (ops/table_activation.py)"),
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
        Step("micro_batch_loop", micro_batch_loop, "with k > 1 micro-batches, the calls as a "
             "loop body whose int32 gradients add up at one exponent "
             "(program/niti_micro_batch.py)"),
        Step("optimizer_updates", fp32.add_optimizer_updates, "NITI's update per trained "
             "parameter (program/optimizer_update.py)"),
        Rewrite("early_updates", fp32.updates_early, "each update right after the last use "
                "of its parameter and gradient (program/optimizer_update.py)",
                requires=fp32.has_updates),
        Step("finish_train", fp32.finish_train, "the train_step program"),
        Step("predict", fp32.walk_predict, "the evaluation-mode forward "
             "(program/predict_step.py)"),
        Rewrite("share_in_place", fp32.in_place, "an elementwise kernel writes over an input "
                "that dies there (program/inplace.py)"),
        Step("frozen_state_in_flash", fp32.frozen_in_flash, "on targets whose flash and SRAM "
             "are distinct, state no step writes (the exponents, frozen layers) as const data "
             "(program/frozen_state.py)"),
        Rewrite("fold_frozen_calls", fp32.fold_frozen, "kernels over frozen weights evaluated "
                "at compile time (the backward's copy of a frozen per-channel weight at its "
                "coarsest exponent), on targets that keep frozen state in flash "
                "(program/frozen_state.py)", requires=fp32.state_in_flash),
        Step("plan_memory", fp32.memory_plan, "one arena (memory/plan.py)", phase=fp32.PLAN),
    ),
    finishing=(
        Step("fit_memory_budget", fit_memory_budget, "keep, recompute, page or micro-batch to "
             "fit a budget (memory/budget.py, memory/micro_batching.py)"),
        Step("dsp_placement", dsp_placement, "on a DSP target: each call of the step on the "
             "DSP or the CPU (offload/placement.py)"),
        Step("check_board", fp32.check_board, "the plan against the board's SRAM and flash "
             "(targets/fit.py)", phase=fp32.WRITE),
        Step("split_for_dsp", split_for_dsp, "with NITI(dsp_offload=True): the step cut into "
             "a CPU part and a DSP part (offload/split.py)"),
        Step("write_project", project, "model.h, model.c, CMakeLists.txt, runtime_c "
             "(project/emit.py); a split step's CPU part"),
        Step("package", package, "what the compile tells its caller (int8/package.py)"),
    ),
    check_options=check_options,
    checked_optimizer=checked_optimizer,
)
