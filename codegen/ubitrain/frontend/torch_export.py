"""torch.nn.Module → TVM Relax, through torch.export.

TVM's own importer freezes BatchNorm's running statistics and drops Dropout, which is wrong
for training, so ubitrain walks the exported FX graph itself. The export is functionalised:
every op is out of place, and the graph signature says which outputs are the new values of
mutated buffers (BatchNorm's running stats).

The graph is the one `torch.export.export(...).run_decompositions(RECURRENT_DECOMPOSITIONS)`
gives: composite ops (conv2d, linear, layer_norm, ...) kept whole, recurrent ones unrolled.
That public route traces the model twice (the training IR, then its decomposition); one
trace below autograd (`torch.export._trace._export(pre_dispatch=False)`), with the same
composite ops kept, gives the same graph in half the time; where it fails (an in-place op
on a constant), the two traces run. Both are PyTorch's own; the private one is pinned by
`torch==2.13.0`, and tests/test_export_route.py checks that the two routes still give one
graph.

The result is a `ForwardGraph` (frontend/forward.py).
"""

from __future__ import annotations

import difflib
import functools
import warnings

import torch
from torch.export import _trace
from torch.export.exported_program import (
    _override_composite_implicit_decomp,
    _split_decomp_table_to_cia_and_python_decomp,
)
from torch.fx import config as fx_config
from tvm import relax

from ..errors import CompileError, UnsupportedOpError
from .aten import ATEN_CONVERTERS, ConvertContext, supported_op_names
from .constants import fold_constants
from .dtypes import check_traced_dtypes
from .forward import StateTensor, TensorSpec, c_name, emit_forward
from .module_calls import checked_calls
from .recurrent import RECURRENT_DECOMPOSITIONS, ignore_recurrent_noise


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@functools.cache
def _composite_ops() -> dict:
    """{composite op: what it becomes}: each kept whole but the recurrent ones, unrolled,
    as `run_decompositions(RECURRENT_DECOMPOSITIONS)` would."""
    composite, python_only = _split_decomp_table_to_cia_and_python_decomp(
        dict(RECURRENT_DECOMPOSITIONS))
    assert not python_only, f"not composite ops: {list(python_only)}"
    return composite


def _one_trace(model, example_inputs):
    """The exported program in one trace, or None where that trace fails and the two-trace
    route must do (an in-place op on a constant, such as the mask nn.MultiheadAttention makes
    of a boolean attn_mask: aot_autograd finds it unfunctionalised)."""
    try:
        with _override_composite_implicit_decomp(_composite_ops()):
            return _trace._export(model, example_inputs, strict=False, pre_dispatch=False)
    except CompileError:  # a module call or an RNN refused: the other route would too
        raise
    except Exception:  # noqa: BLE001 - the two-trace route traces it, or says why not
        return None


def _modes(model: torch.nn.Module) -> dict:
    return {m: m.training for m in model.modules()}


def export_module(model: torch.nn.Module, example_inputs: tuple, training: bool):
    """The exported program of the training step (`training`: every module in the mode the
    user left it in, as PyTorch trains it: a BatchNorm in eval mode normalises with its
    running statistics and leaves them alone, a Dropout in eval mode is the identity) or of
    the evaluation-mode forward (every module in eval mode)."""
    modes = _modes(model)
    if not training:
        model.eval()
    # No Python stack trace per FX node (node.meta["stack_trace"], which ubitrain never
    # reads; errors name modules from nn_module_stack): 15-20% of an export's time.
    was_skipping_traces = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        with warnings.catch_warnings(), checked_calls(model):
            warnings.simplefilter("ignore", FutureWarning)  # torch.export's, not the user's
            ignore_recurrent_noise()
            exported = _one_trace(model, tuple(example_inputs))
            if exported is None:
                exported = torch.export.export(model, tuple(example_inputs), strict=False)
                exported = exported.run_decompositions(RECURRENT_DECOMPOSITIONS)
    except CompileError:  # a module call (frontend/module_calls.py) or an RNN refused
        raise
    except Exception as err:  # torch's own message says which construct it could not trace
        raise CompileError(
            f"torch.export could not trace {type(model).__name__}: {err}. ubitrain needs a "
            "module with static shapes and no data-dependent Python control flow."
        ) from None
    finally:
        for module, mode in modes.items():
            module.training = mode
        fx_config.do_not_emit_stack_traces = was_skipping_traces
    return exported


def _state_names(model: torch.nn.Module) -> tuple[dict, dict]:
    """({name: tensor}, {name: canonical name}) over every state_dict name. A tensor that
    several modules share (`b.weight = a.weight`, a tied embedding and output layer) is one
    state tensor under its first name, as one tensor in PyTorch: its gradient is the sum of
    every use's, and it has one optimizer state."""
    tensors = {**dict(model.named_parameters(remove_duplicate=False)),
               **dict(model.named_buffers(remove_duplicate=False))}
    first: dict[int, str] = {}
    canonical = {name: first.setdefault(id(t), name) for name, t in tensors.items()}
    return tensors, canonical


def module_path(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "<top>"
    path = list(stack.values())[-1][0]
    return path or "<top>"


def check_supported(exported, folded=()) -> None:
    """Fail before any lowering, naming every unsupported op, where it is in the module and
    the supported ops whose names are closest. `folded`: nodes torch computes at compile
    time (frontend/constants.py), which need no converter."""
    problems = {}
    for node in exported.graph.nodes:
        if (node.op == "call_function" and node.target not in ATEN_CONVERTERS
                and node not in folded):
            label = op_label(node.target)
            problems.setdefault(f"{module_path(node)}: {label} is not supported", label)
    if problems:
        supported = [n.split(".")[-1] for n in supported_op_names()]
        lines = []
        for problem, label in problems.items():
            near = difflib.get_close_matches(label.split(".")[-1 if label.count(".") < 2 else 1],
                                             supported, n=3)
            close = ", ".join(f"aten.{n}" for n in near)
            lines.append(problem + (f" (supported and close: {close})" if near else ""))
        raise UnsupportedOpError("; ".join(lines) + ". The README's 'What is supported' "
                                 "lists every supported op.")


def op_label(target) -> str:
    """"aten.elu" for a default overload, "aten.conv2d.padding" for another one."""
    if getattr(target, "_overloadpacket", None) is None:
        return getattr(target, "__name__", str(target))
    name = str(target)
    return name[: -len(".default")] if name.endswith(".default") else name


def import_forward(model: torch.nn.Module, example_inputs: tuple, training: bool,
                   extend=None, converters=None) -> tuple:
    """Convert `model` into a Relax function (`converters`: {ATen op: converter} in place of
    the float ones, such as the int8 pipeline's tables, ops/table_activation.py).

    `extend(bb, graph)` runs inside the function's dataflow block after the forward pass and
    returns `(extra_params, outputs)`: the training graph appends its loss there. Without it
    the function returns the model output. Parameters are ordered: model inputs, extra
    params, state (parameters and buffers), Dropout masks.
    """
    exported = export_module(model, example_inputs, training)
    folded = fold_constants(exported, lambda node: node.target in ATEN_CONVERTERS)
    check_traced_dtypes([n for n in exported.graph.nodes if n not in folded],
                        lambda n: f"{module_path(n)}: {op_label(n.target)}")
    check_supported(exported, folded)
    signature = exported.graph_signature
    state_dict, canonical = _state_names(model)
    param_names = set(dict(model.named_parameters(remove_duplicate=False)))

    bb = relax.BlockBuilder()
    env: dict = {}
    inputs, input_specs, state, state_vars = [], [], [], {}
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"]
    user_inputs = iter(example_inputs)
    for spec, node in zip(signature.input_specs, placeholders):
        kind, target = spec.kind.name, spec.target
        if kind in ("PARAMETER", "BUFFER"):
            name = canonical[target]  # a tied tensor's placeholders all read its one slot
            if name not in state_vars:
                tensor = state_dict[name].detach()
                state_vars[name] = relax.Var(c_name(name), relax.TensorType(
                    tuple(tensor.shape), _dtype_name(tensor.dtype)))
                aliases = tuple(a for a, c in canonical.items() if c == name and a != name)
                state.append(StateTensor(name, tensor.cpu().numpy().copy(),
                                         name in param_names,
                                         bool(state_dict[name].requires_grad), aliases))
            var = state_vars[name]
        elif kind == "CONSTANT_TENSOR":  # a plain tensor attribute: part of the graph
            var = relax.const(exported.constants[target].detach().cpu().numpy())
        else:
            example = next(user_inputs, None)
            if not isinstance(example, torch.Tensor):
                raise CompileError(f"model input {node.name} must be a tensor, got "
                                   f"{type(example).__name__}")
            var = relax.Var(node.name, relax.TensorType(tuple(example.shape),
                                                      _dtype_name(example.dtype)))
            inputs.append(var)
            input_specs.append(TensorSpec(node.name, tuple(example.shape),
                                          _dtype_name(example.dtype)))
        env[node] = var

    mutation_targets = {o.arg.name: canonical.get(o.target, o.target)
                        for o in signature.output_specs
                        if o.kind.name == "BUFFER_MUTATION"}
    # An in-place op on a model input (`F.relu(x, inplace=True)`) exports the input's new
    # value as an extra output; the step does not write the caller's batch back.
    input_mutations = {o.arg.name for o in signature.output_specs
                       if o.kind.name == "USER_INPUT_MUTATION"}
    ctx = ConvertContext(bb=bb, training=training, converters=converters or {},
                         model_inputs=frozenset(s.name for s in input_specs))

    def body():
        outputs = []
        for node in exported.graph.nodes:
            if node in folded:
                env[node] = _as_constant(folded[node])
            elif node.op == "call_function":
                ctx.where = module_path(node)
                env[node] = _convert(ctx, node, env)
            elif node.op == "output":
                outputs = list(node.args[0])
        user_outputs = [env[o] for o in outputs
                        if o.name not in mutation_targets and o.name not in input_mutations]
        updates = {mutation_targets[o.name]: env[o] for o in outputs if o.name in mutation_targets}
        for spec in input_specs:  # embedding ids: the step checks them (frontend/aten/embedding)
            spec.index_bound = ctx.index_bounds.get(spec.name)
        return user_outputs, updates

    mod, graph = emit_forward(ctx, inputs, input_specs, state, state_vars, body, extend)
    graph.state_names = list(canonical)
    return mod, graph


def _as_constant(value):
    if isinstance(value, (list, tuple)):
        return type(value)(_as_constant(v) for v in value)
    if isinstance(value, torch.Tensor):  # an expand's view: its own bytes
        return relax.const(value.detach().cpu().contiguous().numpy())
    return value


def _convert(ctx: ConvertContext, node, env):
    def resolve(a):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(resolve(x) for x in a)
        return a

    args = resolve(node.args)
    kwargs = {k: resolve(v) for k, v in node.kwargs.items()}
    try:
        convert = ctx.converters.get(node.target) or ATEN_CONVERTERS[node.target]
        return convert(ctx, node, *args, **kwargs)
    except CompileError:
        raise
    except Exception as err:
        raise CompileError(f"{ctx.where}: converting {op_label(node.target)} failed: "
                           f"{err}") from err

