"""`ub.compile`: a model, a loss, an optimizer and a target in; a C training project out."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .errors import CompileError
from .frontend.onnx_import import is_onnx_model, load_onnx
from .kernels.library import KernelLibrary
from .memory.micro_batching import (
    batch_coupled_layers,
    check_micro_batches,
    fit_micro_batched,
    one_batch_dimension,
    warn_batch_coupled,
)
from .memory.plan import MemoryPlan, plan_memory
from .optim import OPTIMIZERS, SGD
from .program.build import build_programs
from .program.frozen_state import fold_frozen_calls, keep_frozen_state_in_flash
from .program.ir import Program, Slot
from .program.passes import Passes, passes
from .progress import Steps
from .project.emit import render_project
from .project.manifest import write_manifest
from .runtime.build import cmake_build
from .runtime.host_trainer import HostTrainer
from .targets import check_board_fit, get_target
from .training.graph import build_training_module
from .training.losses import LOSSES

PRECISIONS = ("fp32", "int8")
COMPILE_STEPS = ["trace and differentiate", "lower kernels", "plan memory", "write C project"]


@dataclass
class Package:
    """A compiled model: the C project in `out_dir` and what is known about it."""

    out_dir: Path
    model_name: str
    target: str
    memory_plan: MemoryPlan
    inputs: list[Slot]
    labels: Slot
    output: Slot
    classes: int | None
    trainable: list[str]
    programs: dict[str, Program] = field(repr=False, default_factory=dict)
    kernel_count: int = 0
    compile_seconds: float = 0.0
    frozen_in_flash: list[str] = field(default_factory=list)  # state kept as const data
    aliases: dict[str, str] = field(default_factory=dict)  # tied tensor's name -> its slot's

    def build(self, seed: int = 0, progress: bool | None = None,
              arena_fill: int = 0) -> HostTrainer:
        """Build the C project with CMake and load it (host target), or cross-compile it
        and start its driver under the target's emulator (runtime/emulated_trainer.py).
        `arena_fill`: the byte the host arena starts as (0xFF: NaN, to catch a read of
        memory that nothing wrote)."""
        if not get_target(self.target).runs_on_host:
            from .runtime.target_build import start_trainer
            return start_trainer(self, get_target(self.target), seed=seed, progress=progress)
        build_dir = cmake_build(self.out_dir, self.out_dir / "build", progress=progress)
        library = next(build_dir.glob(f"libub_{self.model_name}.so"), None)
        if library is None:
            raise CompileError(f"the build produced no libub_{self.model_name}.so in {build_dir}")
        return HostTrainer(loadable_copy(library), self, seed=seed, arena_fill=arena_fill)


def loadable_copy(library: Path) -> Path:
    """A copy of `library` named after its content. The dynamic loader hands out the library
    a process already loaded from a path again, so a model recompiled into the same out_dir
    would run its old code with the new package's shapes; a new build has a new name."""
    digest = hashlib.sha256(library.read_bytes()).hexdigest()[:16]
    copy = library.with_name(f"{library.stem}-{digest}{library.suffix}")
    if not copy.exists():
        for stale in library.parent.glob(f"{library.stem}-*{library.suffix}"):
            stale.unlink()  # a process that loaded it keeps its mapping
        shutil.copyfile(library, copy)
    return copy


def _as_tensor(x, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    raise CompileError(f"{what} must be a torch.Tensor or numpy array, got {type(x).__name__}")


def _model_name(model, out_dir: Path) -> str:
    base = re.sub(r"[^0-9a-zA-Z]+", "_", out_dir.name or type(model).__name__).strip("_")
    base = base.lower() or "model"
    return base if not base[0].isdigit() else "m_" + base


def _checked_io(example_inputs, labels, out_dir) -> tuple[tuple, torch.Tensor, Path]:
    """The example inputs as a tuple of tensors, the labels as a tensor, and a writable
    out_dir: what every precision's compile starts from."""
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    example_inputs = tuple(_as_tensor(x, "example input") for x in example_inputs)
    labels = _as_tensor(labels, "labels")
    for what, t in [(f"example input {i}", x) for i, x in enumerate(example_inputs)] + \
            [("labels", labels)]:
        if t.numel() == 0:
            raise CompileError(f"{what} has shape {list(t.shape)}: it holds no element; "
                               "compile with a batch of at least one sample")
    out_dir = Path(out_dir)
    _check_out_dir(out_dir)
    return example_inputs, labels, out_dir


def _check_out_dir(out_dir: Path):
    probe = out_dir
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise CompileError(f"out_dir={str(out_dir)!r} cannot be created: {str(probe)!r} is a "
                           "file; pass a directory path")
    if not os.access(probe, os.W_OK):
        raise CompileError(f"out_dir={str(out_dir)!r} is not writable (no write permission on "
                           f"{str(probe)!r}); pass a directory you can write to")


@dataclass
class _Lowered:
    """The step lowered at one number of micro-batches, with its unconstrained plan."""

    tm: object
    library: KernelLibrary
    train: Program
    predict: Program
    state: dict
    opt_state: dict
    inputs: list[Slot]
    labels: Slot
    output: Slot
    frozen: dict
    folded_bytes: int
    plan: MemoryPlan


def _lower(tm, optimizer, tgt, switches: Passes) -> _Lowered:
    library = KernelLibrary(tgt.isa if switches.on("microkernels") else "scalar",
                            reuse_outputs=switches.on("output_reuse"))
    train, predict, state, opt_state, inputs, label_slot, output = build_programs(
        tm, optimizer, library, tgt.accumulate_dtype, switches)
    frozen, folded_bytes = {}, 0
    if tgt.frozen_state_in_flash:
        frozen = keep_frozen_state_in_flash([train, predict], state)
        if switches.on("fold_frozen_calls"):
            folded_bytes = fold_frozen_calls([train, predict], library)
    plan = plan_memory([train, predict], alignment=tgt.alignment)
    return _Lowered(tm, library, train, predict, state, opt_state, inputs, label_slot, output,
                    frozen, folded_bytes, plan)


def compile(model, example_inputs, labels, loss: str = "cross_entropy", optimizer=None,
            trainable=None, target: str = "host", precision: str = "fp32",
            memory_budget=None, out_dir="build/model", progress: bool | None = None,
            fusion: bool = True, micro_batches: int | None = None,
            disable_passes=()) -> Package:
    """`progress`: a bar on stderr over the compile steps (None: when stderr is a terminal).
    `disable_passes`: names of rewrite passes to switch off (program/passes.py lists them),
    for debugging: the step trains the same, bit for bit but for "microkernels".
    `fusion=False` is `disable_passes=("fuse_kernels",)`. `micro_batches=k` runs each step
    as k micro-batches of batch/k samples with gradient accumulation (program/micro_batch.py);
    None lets a `memory_budget` choose k (memory/micro_batching.py), else 1."""
    start = time.perf_counter()
    tgt = get_target(target)
    if loss not in LOSSES:
        raise CompileError(f"unknown loss {loss!r}; supported: {', '.join(LOSSES)}")
    if precision not in PRECISIONS:
        raise CompileError(f"precision {precision!r} is not available for target {target!r}; "
                           f"available: {', '.join(PRECISIONS)}")
    if precision == "int8" and micro_batches not in (None, 1):
        raise CompileError(f"micro_batches={micro_batches!r} is not available with "
                           "precision='int8'; use precision='fp32' or micro_batches=None")
    if precision == "int8":  # NITI integer-only training: its own lowering (int8/compile.py)
        from .int8.compile import compile_int8
        return compile_int8(model, example_inputs, labels, loss, optimizer, trainable, target,
                            memory_budget, out_dir)
    switches = passes(tuple(disable_passes) + (() if fusion else ("fuse_kernels",)))
    optimizer = optimizer if optimizer is not None else SGD()
    if not isinstance(optimizer, OPTIMIZERS):
        raise CompileError(f"optimizer must be ub.SGD, ub.Adam or ub.AdamW, got "
                           f"{type(optimizer).__name__}")
    if is_onnx_model(model):
        model = load_onnx(model)
    elif not isinstance(model, torch.nn.Module):
        raise CompileError(f"model must be a torch.nn.Module, an .onnx path or an "
                           f"onnx.ModelProto, got {type(model).__name__}")
    example_inputs, labels, out_dir = _checked_io(example_inputs, labels, out_dir)
    batch = int(example_inputs[0].shape[0]) if example_inputs[0].dim() else 1
    if micro_batches is not None:
        micro_batches = check_micro_batches(micro_batches, example_inputs, labels)

    def trace(k):
        try:
            return build_training_module(model, example_inputs, labels, loss, trainable, k)
        except CompileError as err:
            if k == 1:
                raise
            raise CompileError(f"micro_batches={k} traces the model on micro-batches of "
                               f"{batch // k} samples, which failed: {err} Use "
                               f"micro_batches=1, or a model that takes any batch size"
                               ) from None

    with Steps("ubitrain compile", COMPILE_STEPS, progress) as step:
        step("trace and differentiate")
        tm = trace(micro_batches or 1)
        step("lower kernels")
        low = _lower(tm, optimizer, tgt, switches)
        step("plan memory")
        train, plan = low.train, low.plan
        coupled = None  # the layers that couple samples: a float64 probe, run once
        if memory_budget is not None:  # micro-batch / recompute / page to fit (memory/)
            coupled = batch_coupled_layers(model, tm, example_inputs)
            low, train, plan = fit_micro_batched(
                low, lambda k: _lower(trace(k), optimizer, tgt, switches), memory_budget,
                target, batch, micro_batches, bool(coupled),
                one_batch_dimension(example_inputs, labels))
        tm, library, predict, state, opt_state = (low.tm, low.library, low.predict,
                                                  low.state, low.opt_state)
        inputs, label_slot, output, frozen = low.inputs, low.labels, low.output, low.frozen
        if tm.micro_batches > 1:
            warn_batch_coupled(coupled if coupled is not None else
                               batch_coupled_layers(model, tm, example_inputs),
                               tm.micro_batches, batch)
        check_board_fit(tgt, plan, inputs, label_slot, output,
                        weight_bytes=sum(s.nbytes for s in state.values()) + low.folded_bytes)
        step("write C project")
        classes = output.shape[-1] if loss == "cross_entropy" else None
        name = _model_name(model, out_dir)
        called = {c.kernel for prog in (train, predict) for c in prog.calls}
        render_project(out_dir, name, train, predict, plan, library.sources(called), state,
                       opt_state, tm.trainable, inputs, label_slot, output, classes, frozen,
                       library.unread_arguments(), list(library.support.values()))
    package = Package(out_dir=out_dir, model_name=name, target=target, memory_plan=plan,
                      inputs=inputs, labels=label_slot, output=output, classes=classes,
                      trainable=tm.trainable, programs={"train_step": train, "predict": predict},
                      kernel_count=len(library.kernels), frozen_in_flash=list(frozen),
                      aliases=tm.graph.aliases(), compile_seconds=time.perf_counter() - start)
    write_manifest(package)  # package.json: the project loads without this process
    return package
