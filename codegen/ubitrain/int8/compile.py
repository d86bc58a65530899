"""`ub.compile(..., precision="int8")`: the model lowered to NITI layers, the integer step
programs planned into one arena and written as the same kind of C project as the float path
(same C API, driver and CMake files), with this package's kernels."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..api import Package
from ..errors import CompileError
from ..frontend.onnx_import import is_onnx_model, load_onnx
from ..memory.plan import plan_memory
from ..program.ir import Program
from ..project.emit import render_project
from ..project.manifest import write_manifest
from ..targets import check_board_fit, get_target
from ..training.sparse_update import SparseUpdate
from .layers import LayerProgram
from .lower import lower_module
from .onnx_lower import lower_onnx
from .placement import place
from .program import build_int8_programs
from .simd import isa_for
from .trainer import Int8Trainer
from .update import NITI

MAX_CLASSES = 512  # the softmax gradient's P * 2^11 stays within int32


@dataclass
class Int8Package(Package):
    """A compiled int8 model; `build()` returns an Int8Trainer. A module-level class, so that
    a package pickles (the fleet sends it to its worker processes)."""

    layer_program: LayerProgram | None = field(default=None, repr=False)
    placement: list | None = field(default=None, repr=False)  # hexagon-v66: DSP / CPU
    segments: list | None = field(default=None, repr=False)  # dsp_offload: DSP methods
    overlaps: list | None = field(default=None, repr=False)  # CPU kernels during each
    config: NITI | None = None
    precision: str = "int8"

    def build(self, seed: int = 0, **kwargs) -> Int8Trainer:
        if self.segments is not None:
            from .offload_trainer import start_split_trainer
            return Int8Trainer(start_split_trainer(self, seed), self)
        return Int8Trainer(super().build(seed=seed, **kwargs), self)


def freeze(program: LayerProgram, trainable, no_grad: frozenset = frozenset()) -> None:
    """Train only the weights `trainable` names (a list, one name, or a SparseUpdate of whole
    layers; None: all) that are not in `no_grad` (requires_grad=False, which PyTorch never
    updates); the others stay as they are and get no gradient."""
    names = list(program.weights)
    if trainable is None:
        chosen = names
    elif isinstance(trainable, SparseUpdate):
        if trainable.channels:
            raise CompileError("precision='int8' trains whole weights; SparseUpdate(channels="
                               "...) is fp32 only (use last_layers=k or a list of names)")
        chosen = trainable.select(names)
    else:
        chosen = [trainable] if isinstance(trainable, str) else list(trainable)
        named_frozen = [t for t in chosen if t in no_grad]
        if named_frozen:
            raise CompileError(f"trainable names {named_frozen}, which have requires_grad="
                               "False: PyTorch would not train them. Call requires_grad_(True) "
                               "on them or leave them out of trainable")
    chosen = [t for t in chosen if t not in no_grad]
    unknown = [t for t in chosen if t not in names]
    if unknown or not chosen:
        raise CompileError(f"trainable={trainable!r}: precision='int8' trains conv and linear "
                           f"weights; name at least one of: {', '.join(names)}"
                           + (f" ({unknown} are not among them)" if unknown else ""))
    for layer in program.convs():
        layer.trainable = layer.weight in chosen
    program.number_sites()


def compile_int8(model, example_inputs, labels, loss, optimizer, trainable, target,
                 memory_budget, out_dir):
    from ..api import _checked_io, _model_name

    start = time.perf_counter()
    tgt = get_target(target)
    if loss != "cross_entropy":
        raise CompileError(f"precision='int8' trains with NITI's integer softmax cross-entropy; "
                           f"loss={loss!r} has no integer form: use loss='cross_entropy'")
    config = optimizer if optimizer is not None else NITI()
    if not isinstance(config, NITI):
        raise CompileError(f"precision='int8' updates weights with NITI's integer rule, not "
                           f"{type(config).__name__} (no learning rate or momentum in int8); "
                           "pass optimizer=ub.NITI(mu=(5, 4, 3), milestones=(...)) or None")
    onnx_model = load_onnx(model) if is_onnx_model(model) else None
    if onnx_model is None and not isinstance(model, torch.nn.Module):
        raise CompileError(f"model must be a torch.nn.Module, an .onnx path or an "
                           f"onnx.ModelProto, got {type(model).__name__}")
    example_inputs, labels, out_dir = _checked_io(example_inputs, labels, out_dir)
    model_name = _model_name(model, out_dir)
    if len(example_inputs) != 1:
        raise CompileError(f"precision='int8' trains a model with one input; got "
                           f"{len(example_inputs)}")
    x = example_inputs[0]
    if not x.dtype.is_floating_point or labels.dim() != 1 or labels.shape[0] != x.shape[0] \
            or labels.dtype != torch.int64:
        raise CompileError("precision='int8' needs a float input batch and int64 class labels "
                           f"[batch]; got input {x.dtype} and labels {labels.dtype} "
                           f"{list(labels.shape)}")
    if onnx_model is not None:
        program = lower_onnx(onnx_model, x.float(), config.float_fallback)
    else:
        program = lower_module(model, x.float(), config.float_fallback)
    no_grad = frozenset() if onnx_model is not None else frozenset(
        n for n, p in model.named_parameters() if not p.requires_grad)
    if trainable is not None or no_grad:
        freeze(program, trainable, no_grad)
    if program.classes > MAX_CLASSES:
        raise CompileError(f"precision='int8': {program.classes} classes; the integer softmax "
                           f"gradient supports at most {MAX_CLASSES}")
    if config.dsp_offload and tgt.name != "hexagon-v66":
        raise CompileError(f"NITI(dsp_offload=True) splits the step for target='hexagon-v66', "
                           f"not {target!r}")
    # a split step's CPU part runs where config.cpu_target says, with that ISA's kernels
    cpu_isa = isa_for(get_target(config.cpu_target)) if config.dsp_offload else isa_for(tgt)
    cache = config.dsp_cache_bytes if tgt.name == "hexagon-v66" else None
    progs = build_int8_programs(program, config, cpu_isa, cache)
    placement = place(progs.train) if tgt.name == "hexagon-v66" else None
    order = None
    if config.dsp_offload:  # DSP weight updates late, to run beside CPU kernels (overlap.py)
        from .overlap import defer_weight_updates
        order = defer_weight_updates(progs.train, placement)
        progs.train = Program(progs.train.name, [progs.train.calls[k] for k in order])
        placement = [placement[k] for k in order]
    plan = plan_memory([progs.train, progs.predict], alignment=tgt.alignment)
    if memory_budget is not None:
        from ..memory.budget import check_budget
        check_budget(plan, memory_budget)
    check_board_fit(tgt, plan, progs.inputs, progs.labels, progs.output)
    train, kernels, segments, overlaps = progs.train, progs.kernels, None, None
    if config.dsp_offload:
        from . import offload, overlap
        segments = offload.segments_of(progs.train, placement)
        train = offload.split_program(progs.train, segments)
        overlaps = overlap.schedule(train, segments, plan)
        train = overlap.apply(train, segments, plan)
        kernels = kernels + [offload.cpu_source(model_name, segments, plan, overlaps)]
        dsp = build_int8_programs(program, config, isa_for(tgt), cache)
        dsp.train = Program(dsp.train.name, [dsp.train.calls[k] for k in order])
        offload.render_dsp(out_dir, model_name, progs.train, dsp.train, dsp.kernels, segments,
                           plan)
        offload.render_cpu_driver(out_dir, model_name)
    render_project(out_dir, model_name, train, progs.predict, plan, kernels,
                   progs.state, progs.opt_state, list(program.weights), progs.inputs,
                   progs.labels, progs.output, program.classes)
    package = Int8Package(
        out_dir=out_dir, model_name=model_name, target=target, memory_plan=plan,
        inputs=progs.inputs, labels=progs.labels, output=progs.output, classes=program.classes,
        trainable=[c.weight for c in program.convs() if c.trainable],
        programs={"train_step": progs.train, "predict": progs.predict, "cpu_part": train},
        kernel_count=len(progs.kernels) - 2, compile_seconds=time.perf_counter() - start,
        layer_program=program, config=config,
        placement=placement, segments=segments, overlaps=overlaps)
    write_manifest(package)  # package.json: the project loads without this process
    return package
