"""The one float dtype ubitrain trains in: float32, checked before anything is traced.

A float64, float16 or bfloat16 model once reached TVM's legalization, which crashed the
process (float64, float16) or raised a bare TypeError (bfloat16). A PyTorch model's state
and example inputs in another float dtype are compiled as float32 (a copy: the user's model
is left as it was) with a warning naming the dtype; a tensor the forward itself computes in
another float dtype, a complex tensor, or an ONNX model in another dtype is refused by name.
"""

from __future__ import annotations

import copy

import torch

from ..errors import CompileError, warn

CASTABLE = (torch.float64, torch.float16, torch.bfloat16)


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def float32_model(model: torch.nn.Module, example_inputs: tuple, labels: torch.Tensor):
    """(model, example_inputs, labels) with every float tensor float32: a float32 copy of a
    model whose parameters or buffers are in another float dtype, and float32 examples."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    tensors = [(f"parameter or buffer {n!r}", t) for n, t in state.items()] + \
        [(f"example input {i}", x) for i, x in enumerate(example_inputs)] + [("labels", labels)]
    for what, t in tensors:
        if t.is_complex():
            raise CompileError(f"{what} is {_name(t.dtype)}: ubitrain trains real float32 "
                               "models; make it a float32 tensor")
    other = {}
    for name, t in state.items():
        if t.is_floating_point() and t.dtype != torch.float32:
            other.setdefault(t.dtype, []).append(name)
    if other:
        for dtype, names in other.items():
            rounding = ", values rounded" if dtype == torch.float64 else ""
            warn(f"the model's {_listed(names)} {'is' if len(names) == 1 else 'are'} "
                 f"{_name(dtype)}; ubitrain trains in float32: it compiles a float32 copy "
                 f"(model.float(){rounding}) and leaves your model as it is")
        try:
            model = copy.deepcopy(model).float()
        except Exception as err:  # noqa: BLE001 - a module that does not deep-copy
            raise CompileError(f"the model is {_name(next(iter(other)))} and cannot be copied "
                               f"to cast it ({err}); pass model.float()") from None
    inputs = []
    for i, x in enumerate(example_inputs):
        if x.is_floating_point() and x.dtype != torch.float32:
            warn(f"example input {i} is {_name(x.dtype)}; the step is compiled for float32 "
                 "batches: trainer.step and predict take float32 arrays")
            x = x.float()
        inputs.append(x)
    if labels.is_floating_point():  # mse targets: the step reads float32 labels
        labels = labels.float()
    return model, tuple(inputs), labels


def check_traced_dtypes(nodes, describe) -> None:
    """Refuse an op of the traced forward that computes in another float dtype (a
    `.double()` or `.half()` inside forward): name the op and where it is."""
    for node in nodes:
        val = node.meta.get("val") if node.op == "call_function" else None
        if isinstance(val, (list, tuple)):
            val = next((v for v in val if isinstance(v, torch.Tensor)), None)
        if isinstance(val, torch.Tensor) and (val.is_complex() or (
                val.is_floating_point() and val.dtype != torch.float32)):
            raise CompileError(f"{describe(node)} computes in "
                               f"{_name(val.dtype)}; ubitrain trains in float32: keep the "
                               "forward in float32 (no .double(), .half() or autocast)")


ONNX_FLOATS = {"DOUBLE": "float64", "FLOAT16": "float16", "BFLOAT16": "bfloat16"}


def check_onnx_dtypes(graph, onnx) -> None:
    """Refuse an ONNX graph whose inputs or initializers are floats other than float32."""
    tensors = [(f"initializer {t.name!r}", t.data_type) for t in graph.initializer] + \
        [(f"input {i.name!r}", i.type.tensor_type.elem_type) for i in graph.input]
    for what, elem_type in tensors:
        dtype = ONNX_FLOATS.get(onnx.TensorProto.DataType.Name(elem_type))
        if dtype:
            raise CompileError(f"the ONNX model's {what} is {dtype}; ubitrain trains float32 "
                               "models: export the model in float32 (model.float() before "
                               "torch.onnx.export)")
