"""The ATen ops that precision="int8" has an integer (NITI) form for, checked on the exported
model before anything is lowered, so that a refusal names the module and the op (the
integer rewrite of the traced graph, niti_graph.py, sees only Relax). An ONNX model is
checked against the same ops, each node read as the ATen op it computes.

The set is the numpy reference's (fidelity/niti_reference.py): what it cannot compute, the
compiled step could not be checked against either.
"""

from __future__ import annotations

import operator

import torch

from ..errors import UnsupportedOpError
from ..frontend.onnx_aten import TENSOR, aten_uses
from ..frontend.torch_export import export_module, module_path, op_label

aten = torch.ops.aten

INTEGER_OPS = {
    aten.conv2d.default: "conv2d",
    aten.linear.default: "linear",
    aten.relu.default: "relu",
    aten.relu_.default: "relu",
    aten.hardtanh.default: "ReLU6 (hardtanh(0, 6))",
    aten.hardtanh_.default: "ReLU6 (hardtanh(0, 6))",
    aten.max_pool2d.default: "max pooling",
    aten.avg_pool2d.default: "average pooling",
    aten.adaptive_avg_pool2d.default: "adaptive average pooling",
    aten.mean.dim: "the global average",
    aten.add.Tensor: "residual add",
    aten.cat.default: "concat",
    aten.flatten.using_ints: "flatten",
    aten.view.default: "view",
    aten.reshape.default: "reshape",
    # by compile-time table (niti/tables.py)
    aten.sigmoid.default: "sigmoid",
    aten.tanh.default: "tanh",
    aten.silu.default: "SiLU",
    aten.gelu.default: "GELU",
    aten.hardswish.default: "hardswish",
    aten.hardsigmoid.default: "hardsigmoid",
}
# with NITI(batch_norm="integer"): NITI's integer BatchNorm (niti/batch_norm.py)
BATCH_NORM_OPS = {aten._native_batch_norm_legit_functional.default: "BatchNorm",
                  operator.getitem: "BatchNorm"}


# ops whose integer form holds for some arguments only (the rules of niti_rules.py)
def _two_tensors(args) -> bool:
    return len(args) >= 2 and args[0] is TENSOR and args[1] is TENSOR


def _relu6_bounds(args) -> bool:
    """hardtanh(x, 0, m), m a positive integer (niti_rules.py _clip)."""
    lo, hi = args[1:3]
    return isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo == 0 \
        and hi > 0 and float(hi).is_integer()


CONDITIONS = {aten.add.Tensor: _two_tensors, aten.hardtanh.default: _relu6_bounds,
              aten.hardtanh_.default: _relu6_bounds}


def _with_defaults(op, args: tuple) -> tuple:
    """`args` with the positional ones the call left out at their defaults (torch's export
    writes nn.Hardtanh(-1, 1) as hardtanh(x))."""
    rest = [a.default_value for a in op._schema.arguments[len(args):]
            if not a.kwarg_only and a.has_default_value()]
    return (*args, *rest)


def _problem(op, args, known) -> str | None:
    """How `op` over `args` (TENSOR for a tensor) has no integer form (None: it has one)."""
    if op not in known:
        return op_label(op) if op is not None else "no ATen op known"
    if op not in CONDITIONS:
        return None
    args = _with_defaults(op, args)
    return None if CONDITIONS[op](args) else f"{op_label(op)}({', '.join(map(repr, args))})"


def _step_count(node) -> bool:
    """A BatchNorm's num_batches_tracked + 1: an int64 add, which NITI's integer BatchNorm
    keeps as it is (niti_rules.py _add)."""
    return node.target is aten.add.Tensor and \
        getattr(node.meta.get("val"), "dtype", None) == torch.int64


def _refuse(problems: set[str], hint: str = "") -> None:
    if problems:
        ops = ", ".join(sorted(set(INTEGER_OPS.values())))
        raise UnsupportedOpError(
            f"precision='int8': no integer (NITI) form for {'; '.join(sorted(problems))}. "
            f"The integer ops are: {ops}, with BatchNorm folded into the conv or linear "
            f"before it.{hint} Train such a model with precision='fp32'")


def check_integer_ops(model: torch.nn.Module, example_inputs: tuple,
                      batch_norm: bool = False) -> None:
    """Refuse a model with any op outside INTEGER_OPS (and BATCH_NORM_OPS with
    `batch_norm`), or outside its CONDITIONS, naming each by module."""
    if batch_norm:
        _check_integer_batch_norms(model)
    exported = export_module(model, example_inputs, training=True)
    known = {**INTEGER_OPS, **BATCH_NORM_OPS} if batch_norm else INTEGER_OPS
    problems = set()
    for n in exported.graph.nodes:
        if n.op == "call_function" and not (batch_norm and _step_count(n)):
            args = tuple(TENSOR if isinstance(a, torch.fx.Node) else a for a in n.args)
            problem = _problem(n.target, args, known)
            if problem:
                problems.add(f"{module_path(n)}: {problem}")
    _refuse(problems)


# what an ONNX export does differently from the module, where that is the way out
ONNX_HINTS = {
    "BatchNormalization": " An ONNX model's BatchNorm is neither folded nor trained as "
                          "NITI's integer one: compile the PyTorch module itself.",
    "Erf": " GELU exported below opset 20 is Erf arithmetic: export with opset_version=20 "
           "for one Gelu node.",
}


def check_integer_onnx_ops(model) -> None:
    """check_integer_ops for an ONNX model (path or ModelProto): each node as the ATen op it
    computes (frontend/onnx_aten.py), refused by node name and op type."""
    problems, types = set(), set()
    for where, op_type, op, args in aten_uses(model):
        problem = _problem(op, args, INTEGER_OPS)
        if problem:
            problems.add(f"{where} ({op_type}): {problem}")
            types.add(op_type)
    _refuse(problems, "".join(ONNX_HINTS[t] for t in sorted(types) if t in ONNX_HINTS))


def _check_integer_batch_norms(model: torch.nn.Module) -> None:
    """An integer BatchNorm keeps running statistics for predict: refuse, by name, one
    without them (folding takes it: it needs none)."""
    bare = [f"{name} ({type(m).__name__}(track_running_stats=False))"
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and not m.track_running_stats]
    if bare:
        raise UnsupportedOpError(
            f"precision='int8': NITI's integer BatchNorm needs track_running_stats=True; "
            f"{', '.join(bare)} has not. Give it running statistics, or fold it into the "
            "conv before it: optimizer=ub.NITI(batch_norm='fold')")
