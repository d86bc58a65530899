"""The model a command compiles: a factory in a Python file ("path/to/file.py:factory") or an
ONNX file, its example batch, and the optimizer from the command's options."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path


def load_factory(spec: str):
    """"path/to/file.py:name" → the callable `name` defined in that file."""
    from ..errors import CompileError

    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise CompileError(f"model {spec!r} must be given as path/to/file.py:factory")
    file = Path(path)
    if not file.is_file():
        raise CompileError(f"model file {path!r} does not exist")
    module_name = "ubitrain_user_" + "".join(ch if ch.isalnum() else "_" for ch in file.stem)
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    if module_spec is None or module_spec.loader is None:
        raise CompileError(f"model file {path!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.resolve().parent))  # the file may import its neighbours
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any error in the user's file, told in one line
        raise CompileError(f"importing {path!r} failed: {type(err).__name__}: {err}") from None
    finally:
        sys.path.pop(0)
    factory = getattr(module, name, None)
    if factory is None:
        raise CompileError(f"{path!r} defines no {name!r}")
    if not callable(factory):
        raise CompileError(f"{path}:{name} is not callable; give a function that returns the "
                           "model")
    return factory


def _parse_shape(text: str) -> tuple[int, ...]:
    from ..errors import CompileError

    parts = re.split(r"[,x]", text.strip())  # "1,8,8" or "1x8x8"; every part a size
    shape = tuple(int(p) for p in parts) if all(p.strip().isdigit() for p in parts) else ()
    if not shape or min(shape) < 1:
        raise CompileError(f"--input-shape {text!r} is not a shape; give positive sizes such "
                           "as 1,8,8")
    return shape


def model_from_factory(factory, label: str, batch: int | None, input_shape: str | None,
                       loss: str):
    """Call the factory and return (module, example_inputs, labels)."""
    import torch

    from ..errors import CompileError

    takes_batch = "batch" in _parameters(factory)
    try:
        made = factory(batch=batch) if takes_batch and batch is not None else factory()
    except Exception as err:  # noqa: BLE001 - any error in the user's factory, in one line
        raise CompileError(f"{label}() failed: {type(err).__name__}: {err}") from None

    if isinstance(made, torch.nn.Module):
        if input_shape is None:
            raise CompileError(f"{label}() returned only a module; give --input-shape (one "
                               "sample's shape, e.g. 1,8,8) or return (module, example_inputs, "
                               "labels)")
        n = batch or 32
        module, inputs = made, (torch.zeros((n,) + _parse_shape(input_shape)),)
        if loss == "mse":
            modes = {m: m.training for m in module.modules()}  # a frozen BatchNorm's too
            module.eval()
            dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()),
                         torch.float32)  # a float64 model (compiled as float32) runs here
            with torch.no_grad():
                labels = torch.zeros_like(module(*(x.to(dtype) for x in inputs))).float()
            for m, mode in modes.items():
                m.training = mode
        else:
            labels = torch.zeros(n, dtype=torch.long)
        return module, inputs, labels

    if not (isinstance(made, (tuple, list)) and len(made) == 3
            and isinstance(made[0], torch.nn.Module)):
        raise CompileError(f"{label}() must return a torch.nn.Module or (module, "
                           f"example_inputs, labels); it returned {type(made).__name__}")
    module, inputs, labels = made
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    if input_shape is not None:
        raise CompileError("--input-shape applies only to a factory that returns a module "
                           "alone; this one returns its own example inputs")
    got = int(inputs[0].shape[0]) if len(inputs) and len(inputs[0].shape) else None
    if batch is not None and got != batch:
        raise CompileError(f"--batch {batch} differs from the batch of {got} that {label}() "
                           "returned; give the factory a 'batch' parameter to make it follow "
                           "--batch")
    return module, tuple(inputs), labels


def model_from_onnx(path: str, batch: int | None, input_shape: str | None, loss: str):
    """The ONNX model, example inputs shaped from its graph (a symbolic batch dimension
    takes --batch; --input-shape replaces a sample's shape) and labels for the loss."""
    import torch

    from ..errors import CompileError
    from ..frontend.onnx_import import load_onnx

    model = load_onnx(path)
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]

    def shape(value_info, sample=None):
        dims = [d.dim_value or None for d in value_info.type.tensor_type.shape.dim]
        if sample is not None:
            dims = dims[:1] + list(sample)
        dims[0] = batch or dims[0]
        if None in dims:
            raise CompileError(f"{path}: {value_info.name} has a dimension that is not fixed "
                               f"({dims}); give --batch and --input-shape")
        return tuple(dims)

    sample = _parse_shape(input_shape) if input_shape else None
    inputs = tuple(torch.zeros(shape(i, sample)) for i in graph_inputs)
    n = inputs[0].shape[0]
    if loss == "mse":
        labels = torch.zeros(shape(model.graph.output[0]))
    else:
        labels = torch.zeros(n, dtype=torch.long)
    return model, inputs, labels


def _parameters(fn) -> dict:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def make_optimizer(name: str, lr, momentum, weight_decay, clip_grad_norm=None):
    import ubitrain as ub

    kwargs = {}
    if lr is not None:
        kwargs["lr"] = lr
    if clip_grad_norm is not None:
        kwargs["clip_grad_norm"] = clip_grad_norm
    if weight_decay is not None:
        kwargs["weight_decay"] = weight_decay
    if name == "sgd":
        if momentum is not None:
            kwargs["momentum"] = momentum
        return ub.SGD(**kwargs)
    if momentum is not None:
        raise ub.CompileError(f"--momentum applies to sgd only, not to {name}")
    if name == "adam":
        return ub.Adam(**kwargs)
    if name == "adamw":
        return ub.AdamW(**kwargs)
    raise ub.CompileError(f"unknown optimizer {name!r}; choose sgd, adam or adamw")
