"""Train only the first output channels of a layer: split its weight in two parameters.

tiny-training's sparse update trains a fraction of a layer's output channels. ubitrain
splits such a weight `W [O, ...]` into a trained part `W[0:k]` and a frozen part `W[k:O]`,
two parameters of the training function, and splits the layer's op with it:

    conv2d(x, W)            -> concat([conv2d(x, W[0:k]), conv2d(x, W[k:O])], axis=1)
    matmul(x, W^T)          -> concat([matmul(x, W[0:k]^T), matmul(x, W[k:O]^T)], axis=-1)

Each output element is computed by the same reduction as before, so the forward values are
unchanged. Relax's Gradient pass is then asked for the trained part only: the weight
gradient is computed for k channels, never for O. Both parts are views into the one
parameter buffer (program/build.py), so the C API and checkpoints still see `W` whole.
precision="int8" keeps this split; its rewrite joins the parts' integer products as the
unsplit layer's (training/niti_part_rules.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

from ..errors import CompileError
from ..frontend.forward import ForwardGraph, StateTensor, c_name


@dataclass(frozen=True)
class ChannelSplit:
    param: str  # the weight's state_dict name
    channels: int  # O, its output channels
    trained: int  # k: channels 0..k-1 train

    @property
    def partial(self) -> bool:
        return self.trained < self.channels

    @property
    def trained_name(self) -> str:
        return f"{self.param}[0:{self.trained}]" if self.partial else self.param

    @property
    def frozen_name(self) -> str:
        return f"{self.param}[{self.trained}:{self.channels}]"


def plan_splits(graph: ForwardGraph, fractions: dict[str, float]) -> list[ChannelSplit]:
    """One split per `{layer: fraction}` entry; k = ceil(fraction * O) (all: no split)."""
    values = {s.name: s.value for s in graph.state if s.is_parameter}
    layers = sorted({name.rsplit(".", 1)[0] for name in values if "." in name})
    splits, aliases = [], graph.aliases()
    for layer, fraction in fractions.items():
        weight = f"{layer}.weight"
        name = aliases.get(weight, weight)
        tied = [n for n in [name, *aliases] if aliases.get(n, n) == name and n != weight]
        if tied:  # its rows would need splitting under every name at once
            raise CompileError(f"SparseUpdate(channels={{{layer!r}: ...}}): {weight} is tied "
                               f"to {', '.join(tied)} (one tensor); "
                               "a tied weight trains whole or not at all: use last_layers=k "
                               "or a list of names")
        if weight not in values:
            raise CompileError(f"SparseUpdate(channels={{{layer!r}: ...}}): the model has no "
                               f"layer {layer!r} with a weight; its layers: {', '.join(layers)}")
        if not 0 < fraction <= 1:
            raise CompileError(f"SparseUpdate(channels={{{layer!r}: {fraction}}}): a fraction "
                               "of output channels must be in (0, 1]")
        channels = values[weight].shape[0]
        splits.append(ChannelSplit(weight, channels, max(1, math.ceil(fraction * channels))))
    return splits


def split_channels(mod: tvm.IRModule, graph: ForwardGraph,
                   splits: list[ChannelSplit]) -> tuple[tvm.IRModule, ForwardGraph]:
    """Rewrite "main" and its graph so that each split weight is two parameters."""
    splits = [s for s in splits if s.partial]
    if not splits:
        return mod, graph
    func = mod["main"]
    by_var = {graph.state_vars[s.param]: s for s in splits}
    parts, state, state_vars = {}, [], dict(graph.state_vars)
    for tensor in graph.state:
        split = next((s for s in splits if s.param == tensor.name), None)
        if split is None:
            state.append(tensor)
            continue
        var = graph.state_vars[tensor.name]
        dtype = str(var.ty.dtype)
        pair = []
        for name, rows in ((split.trained_name, slice(0, split.trained)),
                           (split.frozen_name, slice(split.trained, split.channels))):
            value = tensor.value[rows]
            part = relax.Var(c_name(name), relax.TensorType(value.shape, dtype))
            state.append(StateTensor(name, np.ascontiguousarray(value), True))
            state_vars[name] = part
            pair.append(part)
        del state_vars[tensor.name]
        parts[var] = tuple(pair)

    params = []
    for p in func.params:
        params.extend(parts.get(p, (p,)))
    bb = relax.BlockBuilder()
    rewriter = _Rewriter(bb, parts, by_var)
    with bb.function("main", params=params):
        with bb.dataflow():
            for block in func.body.blocks:
                for binding in block.bindings:
                    rewriter.rebind(binding)
            result = rewriter.subst(func.body.body)
        bb.emit_func_output(result)
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"})
    out["main"] = bb.get()["main"]
    new_graph = ForwardGraph(inputs=graph.inputs, input_specs=graph.input_specs, state=state,
                             state_vars=state_vars, output=graph.output,
                             buffer_updates=graph.buffer_updates,
                             random_masks=graph.random_masks,
                             state_names=graph.state_names)
    return out, new_graph


class _Rewriter:
    def __init__(self, bb, parts, by_var):
        self.bb, self.parts, self.by_var = bb, parts, by_var
        self.env: dict = {}
        self.transposed: dict = {}  # var of permute_dims(W) -> W

    def subst(self, expr):
        if isinstance(expr, relax.Var):
            if expr in self.parts:
                raise CompileError(f"SparseUpdate(channels=...): {self.by_var[expr].param} "
                                   "is used by an op other than Conv2d (groups=1) or Linear; "
                                   "train a fraction of channels only of those layers")
            return self.env.get(expr, expr)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self.subst(f) for f in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return relax.TupleGetItem(self.subst(expr.tuple_value), expr.index)
        if isinstance(expr, relax.Call):
            return relax.Call(expr.op, [self.subst(a) for a in expr.args], expr.attrs,
                              expr.ty_args)
        return expr

    def rebind(self, binding):
        value, var = binding.value, binding.var
        op = value.op.name if isinstance(value, relax.Call) and isinstance(value.op,
                                                                           tvm.ir.Op) else ""
        if op == "relax.permute_dims" and value.args[0] in self.parts:
            self.transposed[var] = value.args[0]  # consumed by the matmul below
            return
        if op == "relax.nn.conv2d" and value.args[1] in self.parts:
            if int(value.attrs.groups) != 1:
                raise CompileError(f"SparseUpdate(channels=...): {self.by_var[value.args[1]].param}"
                                   f" belongs to a grouped/depthwise Conv2d (groups="
                                   f"{int(value.attrs.groups)}); channel fractions need "
                                   "groups=1; train that layer whole or its biases only")
            x = self.subst(value.args[0])
            halves = [self.bb.emit(relax.Call(value.op, [x, w], value.attrs))
                      for w in self.parts[value.args[1]]]
            self.env[var] = self.emit(R.concat(halves, axis=1), var)
            return
        if op == "relax.matmul" and value.args[1] in self.transposed:
            x = self.subst(value.args[0])
            w = self.transposed[value.args[1]]
            halves = [self.bb.emit(R.matmul(x, self.bb.emit(R.permute_dims(p, [1, 0]))))
                      for p in self.parts[w]]
            self.env[var] = self.emit(R.concat(halves, axis=-1), var)
            return
        for transposed, w in self.transposed.items():
            if _uses(value, transposed):
                raise CompileError(f"SparseUpdate(channels=...): {self.by_var[w].param} is "
                                   "used transposed by an op other than a Linear layer's matmul")
        self.env[var] = self.emit(self.subst(value), var)

    def emit(self, value, var):
        """Keep the function's outputs outputs (Gradient reads the returned tuple)."""
        if isinstance(var, relax.DataflowVar):
            return self.bb.emit(value, var.name)
        return self.bb.emit_output(value, var.name)


def _uses(expr, var) -> bool:
    if isinstance(expr, relax.Var):
        return expr.same_as(var)
    if isinstance(expr, relax.Tuple):
        return any(_uses(f, var) for f in expr.fields)
    if isinstance(expr, relax.TupleGetItem):
        return _uses(expr.tuple_value, var)
    if isinstance(expr, relax.Call):
        return any(_uses(a, var) for a in expr.args)
    return False
