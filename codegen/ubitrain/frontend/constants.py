"""Ops on constants only, computed by torch at compile time.

A plain tensor attribute of the module (not a parameter or buffer) is a constant of the
exported graph. What the model computes from constants alone, such as the additive mask
`nn.MultiheadAttention` makes of a boolean `attn_mask` (zeros_like, masked_fill,
unsqueeze), is computed here by torch itself and enters the graph as one constant: the
converters that need a constant (scaled_dot_product_attention's mask) then see one, and
ops that only ever run on constants need no kernel.

Creation ops without inputs (zeros, arange) are not folded on their own: they stay fill
kernels or constants of their own (frontend/aten/creation.py). Random ops are never folded.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map


def _random(target) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


def fold_constants(exported) -> dict:
    """{FX node: its value (a tensor, or a tuple of them)} for every call whose tensor
    inputs are all constants."""
    values = {}
    for spec, node in zip(exported.graph_signature.input_specs,
                          (n for n in exported.graph.nodes if n.op == "placeholder")):
        if spec.kind.name == "CONSTANT_TENSOR":
            values[node] = exported.constants[spec.target].detach()
    folded = {}
    for node in exported.graph.nodes:
        if node.op != "call_function" or _random(node.target):
            continue
        inputs = [a for a in tree_flatten((node.args, node.kwargs))[0]
                  if isinstance(a, torch.fx.Node)]
        if not inputs or any(a not in values for a in inputs):
            continue
        args, kwargs = tree_map(lambda a: values[a] if isinstance(a, torch.fx.Node) else a,
                                (node.args, node.kwargs))
        with torch.no_grad():
            values[node] = folded[node] = node.target(*args, **kwargs)
    return folded
