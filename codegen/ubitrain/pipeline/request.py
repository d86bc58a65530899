"""`ub.compile`'s arguments checked before any work: each error names the argument at fault
and what would work instead."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import torch

from ..errors import CompileError, warn
from ..frontend.dtypes import float32_model
from ..frontend.onnx_export_mode import warn_if_exported_for_inference
from ..frontend.onnx_import import is_onnx_model, load_onnx
from ..project.c_names import clash
from ..targets import get_target
from ..training.batch_coupling import check_micro_batches
from ..training.losses import LOSSES
from .unit import Request


def checked_request(pipeline, model, example_inputs, labels, loss, optimizer, trainable,
                    target, memory_budget, out_dir, micro_batches, name=None) -> Request:
    tgt = get_target(target)
    if loss not in LOSSES:
        raise CompileError(f"unknown loss {loss!r}; supported: {', '.join(LOSSES)}")
    pipeline.check_options(loss=loss, micro_batches=micro_batches)
    optimizer = pipeline.checked_optimizer(optimizer)
    if is_onnx_model(model):
        model = load_onnx(model)
        warn_if_exported_for_inference(model)
    elif not isinstance(model, torch.nn.Module):
        raise CompileError(f"model must be a torch.nn.Module, an .onnx path or an "
                           f"onnx.ModelProto, got {type(model).__name__}")
    example_inputs, labels, out_dir = checked_io(example_inputs, labels, out_dir)
    if isinstance(model, torch.nn.Module):  # float64/float16/bfloat16: a float32 copy
        model, example_inputs, labels = float32_model(model, example_inputs, labels)
    if micro_batches is not None:
        micro_batches = check_micro_batches(micro_batches, example_inputs, labels)
    return Request(model, example_inputs, labels, loss, optimizer, trainable, tgt,
                   pipeline.precision, memory_budget, out_dir,
                   model_name(model, out_dir, name), micro_batches)


def _as_tensor(x, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    raise CompileError(f"{what} must be a torch.Tensor or numpy array, got {type(x).__name__}")


def checked_io(example_inputs, labels, out_dir) -> tuple[tuple, torch.Tensor, Path]:
    """The example inputs as a tuple of tensors, the labels as a tensor, and a writable
    out_dir."""
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


def model_name(model, out_dir: Path, name: str | None = None) -> str:
    """The C prefix of the project (`ub_<name>_step`): `name`, else the out_dir's name, as a
    C identifier that declares none of ubitrain's own C names again (project/c_names.py)."""
    base = name or out_dir.name or type(model).__name__
    base = re.sub(r"[^0-9a-zA-Z]+", "_", base).strip("_").lower() or "model"
    base = base if not base[0].isdigit() else "m_" + base
    taken = clash(base)
    if taken and name:
        raise CompileError(f"name={name!r} gives the C prefix ub_{base}_, which would declare "
                           f"{taken} of ubitrain's own C again; choose another name")
    if taken:
        chosen = base + "_model"
        while clash(chosen):
            chosen += "_model"
        warn(f"out_dir {out_dir.name!r} would give the C prefix ub_{base}_, which would "
             f"declare {taken} of ubitrain's own C again; the prefix is ub_{chosen}_ (name= "
             "chooses another)")
        base = chosen
    return base


def example_batch(request: Request) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The batch the model is compiled with, as numpy arrays (a board project's example
    firmware trains on it)."""
    return (tuple(x.detach().cpu().numpy() for x in request.example_inputs),
            request.labels.detach().cpu().numpy())
