"""Ops on constants only, computed by torch at compile time.

What a model computes from constants alone is the same at every step: the additive mask
`nn.MultiheadAttention` makes of a boolean `attn_mask`, and the masks and position ids a
Hugging Face model builds from shapes (`arange` of the positions, a comparison of them, an
`expand` to the batch) and from its own int64 buffers (BERT's `position_ids` and
`token_type_ids`, gathered by position). torch computes it here, once, and it enters the
graph as a constant: the converters that need a constant (scaled_dot_product_attention's
mask) then see one, and ops that only ever run on constants (a comparison of positions, a
`gather` of buffer ids) need no kernel.

A constant is what depends only on
- a plain tensor attribute of the module (a CONSTANT_TENSOR of the export),
- a buffer that is not a float (int64 ids, a bool mask) and that the step never writes: a
  float buffer is state the user may load or train (BatchNorm's statistics), an int64 id
  buffer is part of the model's definition,
- a creation op without tensor inputs (arange, zeros, full), and the shape of any tensor
  (`zeros_like(x)`, `new_ones`): its values do not depend on x's.
`empty` is none (its values are undefined) and random ops are never folded.

What is folded, of those constants: an op on a CONSTANT_TENSOR, a non-float buffer or an
`arange` (itself a constant in the graph), an op without a converter (there is no kernel
to run it), and everything computed from a folded node; then, backwards, a constant whose
every user is folded (it is dead). A constant that needs none of that stays its own op, as
before: `zeros(...)` feeding an `add` remains a fill kernel (arena only while it lives, no
bytes in flash).
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

aten = torch.ops.aten

# Ops whose values depend only on their tensor input's shape and dtype, not its values.
_SHAPE_ONLY = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
               aten.new_zeros.default, aten.new_ones.default, aten.new_full.default}
# Creation ops whose converter makes a constant anyway (frontend/aten/creation.py): what is
# computed from them is folded, as from a CONSTANT_TENSOR (position ids for an embedding).
_CONSTANT_CREATION = {aten.arange.default, aten.arange.start, aten.arange.start_step}
# Ops whose values are undefined: never a constant.
_UNDEFINED = {aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
              aten.empty_strided.default, aten.new_empty_strided.default}


def _random(target) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())


def _tensor_inputs(node) -> list:
    return [a for a in tree_flatten((node.args, node.kwargs))[0]
            if isinstance(a, torch.fx.Node)]


def _constant_placeholders(exported) -> dict:
    """{placeholder: its value} for the CONSTANT_TENSORs and the non-float buffers that no
    output of the step writes."""
    written = {o.target for o in exported.graph_signature.output_specs
               if o.kind.name == "BUFFER_MUTATION"}
    buffers = dict(exported.named_buffers())
    values = {}
    for spec, node in zip(exported.graph_signature.input_specs,
                          (n for n in exported.graph.nodes if n.op == "placeholder")):
        if spec.kind.name == "CONSTANT_TENSOR":
            values[node] = exported.constants[spec.target].detach()
        elif spec.kind.name == "BUFFER" and spec.target not in written:
            value = buffers.get(spec.target)
            if value is None:  # a non-persistent buffer
                value = exported.constants.get(spec.target)
            if isinstance(value, torch.Tensor) and not (value.is_floating_point()
                                                        or value.is_complex()):
                values[node] = value.detach()
    return values


def _shape_stand_in(node) -> torch.Tensor:
    """A tensor of `node`'s traced shape and dtype (zeros): what a shape-only op reads."""
    val = node.meta["val"]
    return torch.zeros(tuple(val.shape), dtype=val.dtype)


def constant_values(exported) -> tuple[dict, set]:
    """({FX node: its value (a tensor, or a tuple of them)} for every node that is a
    constant, the roots among them: what is computed from a root is folded whatever its
    users)."""
    values = _constant_placeholders(exported)
    roots = set(values)
    for node in exported.graph.nodes:
        if node.op != "call_function" or _random(node.target) or node.target in _UNDEFINED:
            continue
        inputs = _tensor_inputs(node)
        shape_only = node.target in _SHAPE_ONLY
        if not shape_only and any(a not in values for a in inputs):
            continue

        def value_of(a, shape_only=shape_only):
            if not isinstance(a, torch.fx.Node):
                return a
            return _shape_stand_in(a) if shape_only and a not in values else values[a]

        args, kwargs = tree_map(value_of, (node.args, node.kwargs))
        try:
            with torch.no_grad():
                values[node] = node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not a constant then: converted, or refused by name
            continue
        if node.target in _CONSTANT_CREATION:
            roots.add(node)
    return values, roots


def fold_constants(exported, convertible=lambda node: True) -> dict:
    """{FX node: its value} for every node computed at compile time (the module docstring
    says which). `convertible(node)`: whether the op has a converter."""
    values, roots = constant_values(exported)
    folded = {}
    for node in exported.graph.nodes:
        if node.op != "call_function" or node not in values:
            continue
        inputs = _tensor_inputs(node)
        if (not convertible(node) or any(a in roots or a in folded for a in inputs)):
            folded[node] = values[node]
    for node in reversed(list(exported.graph.nodes)):
        if (node.op == "call_function" and node in values and node not in folded
                and node.users and all(u in folded for u in node.users)):
            folded[node] = values[node]
    return folded
