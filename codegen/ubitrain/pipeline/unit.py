"""The compilation unit: what the user asked for (`Request`) and what the pipeline's steps
have made of it so far (`Unit`), one unit per lowering at a number of micro-batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..targets import Target


@dataclass(frozen=True)
class Request:
    """`ub.compile`'s arguments, checked (pipeline/request.py)."""

    model: object  # a torch.nn.Module, or an ONNX model as frontend/onnx_import loads it
    example_inputs: tuple[torch.Tensor, ...]
    labels: torch.Tensor
    loss: str
    optimizer: object  # ub.SGD / Adam / AdamW, or ub.NITI for precision="int8"
    trainable: object  # None, names, or ub.SparseUpdate
    target: Target
    precision: str
    memory_budget: object  # None, bytes or "256KiB"
    out_dir: Path
    name: str  # the C prefix: ub_<name>_...
    micro_batches: int | None  # forced k, or None: a budget chooses

    @property
    def batch(self) -> int:
        x = self.example_inputs[0]
        return int(x.shape[0]) if x.dim() else 1


@dataclass(eq=False)
class Unit:
    request: Request
    micro_batches: int  # k: the step runs k micro-batches of batch / k samples
    disabled: frozenset[str] = frozenset()  # rewrites switched off by name
    instruments: tuple = ()
    lower: Callable[[int], Unit] | None = None  # the lowering again at another k
    ran: set[str] = field(default_factory=set)  # rewrites that ran
    skipped: dict[str, str] = field(default_factory=dict)  # rewrite -> why it did not run

    # ---- made by the steps, in pipeline order ------------------------------------------
    tm: object = None  # training/graph.py TrainingModule (fp32)
    library: object = None  # kernels/library.py KernelLibrary
    mod: object = None  # the Relax module being legalized
    state: dict = field(default_factory=dict)  # state name -> Slot
    opt_state: dict = field(default_factory=dict)  # trained name -> [Slot]
    parts: dict = field(default_factory=dict)  # weights trained by channels: part -> view
    inputs: list = field(default_factory=list)
    labels: object = None  # Slot
    output: object = None  # Slot
    step_io: list = field(default_factory=list)  # what one (micro-)batch of the step reads
    shadows: dict = field(default_factory=dict)  # BatchNorm buffers looped through copies
    calls: list = field(default_factory=list)  # train_step's calls while it is built
    grads: list = field(default_factory=list)  # the gradient of each trained parameter
    updates: list = field(default_factory=list)  # the optimizer's update calls
    loss: object = None  # the Slot of the loss
    train: object = None  # program/ir.py Program
    predict: object = None
    frozen: dict = field(default_factory=dict)  # state kept in flash: name -> kind
    folded_bytes: int = 0  # constants that folding frozen calls added
    plan: object = None  # memory/plan.py MemoryPlan
    placement: list | None = None  # int8 on a DSP target: DSP or CPU per train_step call
    split: object = None  # with dsp_offload: offload/split.py's DspSplit
    package: object = None  # the compile's result (package.py)

    @property
    def target(self) -> Target:
        return self.request.target

    @property
    def trace_calls(self) -> bool:
        """An instrument asked for a hook after every call of the generated step."""
        return any(getattr(i, "trace_calls", False) for i in self.instruments)
