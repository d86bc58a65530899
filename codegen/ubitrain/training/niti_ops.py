"""The ATen ops that precision="int8" has an integer (NITI) form for, checked on the exported
model before anything is lowered, so that a refusal names the module and the op (the
integer rewrite of the traced graph, niti_graph.py, sees only Relax).

The set is the numpy reference's (fidelity/niti_reference.py): what it cannot compute, the
compiled step could not be checked against either.
"""

from __future__ import annotations

import operator

import torch

from ..errors import UnsupportedOpError
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


def check_integer_ops(model: torch.nn.Module, example_inputs: tuple,
                      batch_norm: bool = False) -> None:
    """Refuse a model with any op outside INTEGER_OPS (and BATCH_NORM_OPS with
    `batch_norm`), naming each by module."""
    if batch_norm:
        _check_integer_batch_norms(model)
    exported = export_module(model, example_inputs, training=True)
    known = {**INTEGER_OPS, **BATCH_NORM_OPS} if batch_norm else INTEGER_OPS
    problems = {f"{module_path(n)}: {op_label(n.target)}" for n in exported.graph.nodes
                if n.op == "call_function" and n.target not in known}

    if problems:
        ops = ", ".join(sorted(set(INTEGER_OPS.values())))
        raise UnsupportedOpError(
            f"precision='int8': no integer (NITI) form for {'; '.join(sorted(problems))}. "
            f"The integer ops are: {ops}, with BatchNorm folded into the conv or linear "
            "before it. Train such a model with precision='fp32'")


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
