"""The float training module made NITI's integer one (precision="int8"): its functions
rewritten by niti_graph.py, its state made integer.

State, in this order: each parameter (an int8 weight quantized from the float one; an int32
bias at its layer's accumulator exponent - BIAS_FRACTION_BITS) followed by its exponent
(int32 (1,), fixed: NITI keeps a weight's scale), then the rescale sites (int32[6] each, the
buffers the step returns updated). The accumulator exponent of a layer is its weight's plus
its input's, the input's taken from the float model on the example batch.

A weight that trains in part (SparseUpdate(channels=...), training/channel_split.py) is
quantized whole, as the unsplit layer's would be; the training function holds it as its two
parts (the trained rows, then the frozen ones), each the weight's rows at the weight's one
exponent (per tensor or per channel), which follows the first part. Predict holds it whole.
The rewrite (niti_part_rules.py) makes the split layer compute the unsplit one's numbers.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import tvm
from tvm import relax

from ..errors import UnsupportedOpError
from ..frontend.forward import StateTensor, c_name
from ..niti import batch_norm
from ..niti.quantize import quantize, quantize_weight
from ..niti.rescale import EXACT, SITE_FIELDS
from ..niti.update import BIAS_FRACTION_BITS
from .batch_norm_folding import BATCH_NORMS
from .graph import TrainingModule
from .niti_graph import Parameter, rewrite_step
from .niti_values import Part

INT32_LIMIT = 2**31 - 1


def _input_exponents(model: torch.nn.Module, example_input: torch.Tensor) -> dict[str, int]:
    """The int8 exponent of each module's input on the example batch, by module name."""
    exponents, hooks = {}, []
    for name, module in model.named_modules():
        def record(mod, args, name=name):
            if args and isinstance(args[0], torch.Tensor):
                exponents[name] = quantize(args[0].detach().float().numpy())[1]
        hooks.append(module.register_forward_pre_hook(record))
    try:
        with torch.no_grad():
            model(example_input)
    finally:
        for h in hooks:
            h.remove()
    return exponents


def _onnx_input_exponents(model, example_input: torch.Tensor) -> dict[str, int]:
    """The same for an ONNX model, by the owner of each bias (its name less `.bias`): the
    exponent of the input of the Conv or Gemm that reads it, from onnx's reference
    evaluator on the example batch."""
    from onnx.reference import ReferenceEvaluator

    from ..frontend.onnx_import import load_onnx

    model = load_onnx(model)
    feeds = {model.graph.input[0].name: example_input.detach().float().numpy()}
    values = ReferenceEvaluator(model).run(None, feeds, intermediate=True)
    values.update(feeds)
    return {node.input[2].rpartition(".")[0]: quantize(np.asarray(values[node.input[0]],
                                                                  np.float32))[1]
            for node in model.graph.node
            if node.op_type in ("Conv", "Gemm") and len(node.input) > 2 and node.input[2]}


def integer_state(model, example_input, floats: dict[str, np.ndarray], channels: bool = False
                  ) -> dict[str, tuple[np.ndarray, int]]:
    """{parameter name: (int8 weight or int32 bias, exponent)} of the float parameters
    `floats`. A BatchNorm's weight (gamma) is an int8 weight too, its bias (beta) an int32
    bias at gamma's exponent - F (niti/batch_norm.py) - BIAS_FRACTION_BITS. `channels`: a conv
    or linear weight has an exponent per output channel (niti/channel_exponents.py), and its
    bias sits below the coarsest."""
    norms = _batch_norm_owners(model)
    ints = {n: quantize_weight(n, v, per_channel=channels and v.ndim > 1)
            for n, v in floats.items()
            if v.ndim > 1 or n.rpartition(".")[0] in norms and n.endswith(".weight")}
    inputs = None
    for name, value in floats.items():
        if name in ints:
            continue
        owner, _, leaf = name.rpartition(".")
        weight = f"{owner}.weight" if owner else "weight"
        if leaf != "bias" or weight not in ints:
            raise UnsupportedOpError(f"precision='int8': parameter {name} is a vector that "
                                     "is no layer's bias; NITI has no integer form for it")
        if owner in norms:
            e = ints[weight][1] - batch_norm.F - BIAS_FRACTION_BITS
        else:
            if inputs is None:
                inputs = _input_exponents(model, example_input) \
                    if isinstance(model, torch.nn.Module) else \
                    _onnx_input_exponents(model, example_input)
            if owner not in inputs:
                raise UnsupportedOpError(f"precision='int8': bias {name} is not read by the "
                                         "conv, Gemm or MatMul of its weight; NITI has no "
                                         "integer form for it")
            e = int(np.max(ints[weight][1])) + inputs[owner] - BIAS_FRACTION_BITS
        b = np.rint(value.astype(np.float64) * 2.0 ** -e)
        if np.abs(b).max(initial=0) > INT32_LIMIT:
            raise UnsupportedOpError(f"precision='int8': bias {name} is too large for int32 "
                                     f"at its layer's scale 2^{e}")
        ints[name] = (b.astype(np.int32), e)
    return ints


def _batch_norm_owners(model) -> set[str]:
    if not isinstance(model, torch.nn.Module):
        return set()
    return {n for n, m in model.named_modules() if isinstance(m, BATCH_NORMS)}


def running_statistics(model: torch.nn.Module, example_input) -> dict[str, list]:
    """An integer BatchNorm's running statistics, by module name: [mean, var, e_mean, e_var]
    (niti/batch_norm.py), the module's float ones at exponents BIAS_FRACTION_BITS below its
    input's on the example batch (the variance's below twice the input's)."""
    inputs = _input_exponents(model, example_input)
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, BATCH_NORMS):
            e_mean = inputs[name] - BIAS_FRACTION_BITS
            e_var = 2 * inputs[name] - BIAS_FRACTION_BITS
            out[name] = [np.rint(m.running_mean.double().numpy() * 2.0 ** -e_mean).astype(np.int64),
                         np.rint(m.running_var.double().numpy() * 2.0 ** -e_var).astype(np.int64),
                         e_mean, e_var]
    return out


COUNTS = ("num_batches_tracked",)  # a BatchNorm's step count: kept as it is


def niti_training_module(tm: TrainingModule, model, example_input, mode: int,
                         max_interval: int, channels: bool = False) -> TrainingModule:
    """`tm` with integer functions and state (see the module's docstring)."""
    norms = _batch_norm_owners(model)
    refused = [what for what, bad in (
        ("buffers other than a BatchNorm's running statistics", any(
            not s.is_parameter and s.name.rpartition(".")[0] not in norms
            for s in tm.graph.state)),
        ("random masks (Dropout)", bool(tm.graph.random_masks))) if bad]
    if refused:
        raise UnsupportedOpError(f"precision='int8' does not train {'; '.join(refused)} yet")
    parts = _parts(tm.channel_splits)
    ints = integer_state(model, example_input, _whole_parameters(tm.graph, parts), channels)
    for name, (weight, rows) in parts.items():  # a part: its rows, the weight's exponent
        ints[name] = (ints[weight][0][rows], ints[weight][1])
    if norms:
        for owner, (mean, var, e_mean, e_var) in running_statistics(model,
                                                                    example_input).items():
            ints[f"{owner}.running_mean"] = (mean.astype(np.int32), e_mean)
            ints[f"{owner}.running_var"] = (var.astype(np.int32), e_var)
    state = _IntegerState(ints, {s.name: s.value for s in tm.graph.state
                                 if s.name.endswith(COUNTS)}, parts)
    main, sites = rewrite_step(tm.mod["main"], "main", state.parameters(tm.graph), mode,
                               max_interval, gradient_exponents=tm.micro_batches > 1)
    predict, _ = rewrite_step(tm.mod["predict"], "predict",
                              state.parameters(tm.predict_graph), EXACT,
                              sites=len(sites))
    site_names = [f"niti.site{i}" for i in range(len(sites))]
    mod = tvm.IRModule({"main": main, "predict": predict})
    return dataclasses.replace(
        tm, mod=mod, graph=_with_state(tm.graph, state.tensors(tm.graph, site_names), main),
        predict_graph=_with_state(tm.predict_graph, state.tensors(tm.predict_graph,
                                                                  site_names), predict),
        buffer_updates=[*tm.buffer_updates, *site_names])


@dataclasses.dataclass
class _IntegerState:
    """The integer state of one graph's functions: `ints` {name: (values, exponent)},
    `counts` {name: a BatchNorm's step count}, `parts` {part name: (weight, rows)}. The
    training graph holds a split weight as its parts, predict's as the weight; either way
    the weight has one exponent."""

    ints: dict
    counts: dict
    parts: dict

    def parameters(self, graph) -> dict[str, Parameter]:
        """By the float function's parameter names, their integer forms."""
        out, exponents = {}, {}  # the parts of a split weight share its exponent's var
        for s in graph.state:
            var = graph.state_vars[s.name]
            if s.name in self.counts:
                out[var.name] = Parameter(s.name, _var(var.name, self.counts[s.name]), None)
                continue
            values, e = self.ints[s.name]
            e = np.atleast_1d(np.int32(e))
            owner, rows = self.parts.get(s.name, (s.name, None))
            if owner not in exponents:
                exponents[owner] = _var(c_name(owner) + "_exponent", e)
            out[var.name] = Parameter(s.name, _var(var.name, values), exponents[owner],
                                      0 if e.size > 1 else None,
                                      Part(owner, rows.start) if rows else None)
        return out

    def tensors(self, graph, site_names) -> list[StateTensor]:
        """As the rewritten function takes them (niti_graph.py state_params): each
        parameter's values, then its exponent once (a split weight's after its first part),
        then the rescale sites."""
        out, placed = [], set()
        for s in graph.state:
            if s.name in self.counts:
                out.append(s)
                continue
            values, e = self.ints[s.name]
            out.append(dataclasses.replace(s, value=values))
            owner = self.parts.get(s.name, (s.name,))[0]
            if owner not in placed:
                placed.add(owner)
                out.append(StateTensor(f"{owner}.exponent", np.atleast_1d(np.int32(e)), False,
                                       False))
        return out + [StateTensor(n, np.zeros(SITE_FIELDS, np.int32), False, False)
                      for n in site_names]


def _parts(splits) -> dict[str, tuple[str, slice]]:
    """{part name: (its weight's name, its rows)} of the weights split by channels."""
    out = {}
    for split in (s for s in splits if s.partial):
        out[split.trained_name] = (split.param, slice(0, split.trained))
        out[split.frozen_name] = (split.param, slice(split.trained, split.channels))
    return out


def _whole_parameters(graph, parts) -> dict[str, np.ndarray]:
    """The float parameters, each split weight whole again: it is quantized as one tensor,
    as the unsplit layer's would be."""
    out = {}
    for s in (s for s in graph.state if s.is_parameter):
        owner, rows = parts.get(s.name, (s.name, None))
        if rows is None:
            out[s.name] = s.value
        elif rows.start == 0:  # the trained part comes first, the frozen one right after
            out[owner] = s.value
        else:
            out[owner] = np.concatenate([out[owner], s.value])
    return out


def _var(name, values):
    return relax.Var(name, relax.TensorType(values.shape, str(values.dtype)))


def _with_state(graph, state, func):
    """`graph` with the integer state; its vars are the new function's state parameters."""
    params = func.params[len(func.params) - len(state):]
    return dataclasses.replace(graph, state=state,
                               state_vars={s.name: v for s, v in zip(state, params)},
                               state_names=[s.name for s in state if s.is_parameter])

