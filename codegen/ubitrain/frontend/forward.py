"""What every frontend produces: the forward pass as one Relax function, and its context.

A frontend converts its graph inside `emit_forward`, which opens the function, lets the
training graph extend it (loss, outputs), and closes it with its parameters ordered: model
inputs, extra parameters (labels), state (parameters and buffers), random masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from ..errors import CompileError


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    index_bound: int | None = None  # embedding ids: every value must lie in [0, bound)


@dataclass(frozen=True)
class RandomMask:
    """A tensor the C runtime draws at the start of every step from its seeded generator
    (`ub_dropout_mask`): each element is 0 with probability `p`, else `scale`. Dropout's
    mask is (p, 1/(1-p)); `bernoulli_(keep)` (StochasticDepth, in-place Dropout) is
    (1 - keep, 1), the scaling left to the model's own ops."""

    var: relax.Var
    p: float
    scale: float


@dataclass
class StateTensor:
    """A parameter or buffer of the module, keyed by its state_dict name."""

    name: str
    value: np.ndarray
    is_parameter: bool
    requires_grad: bool = True  # False: a parameter the user froze (PyTorch never updates it)
    aliases: tuple[str, ...] = ()  # its other state_dict names (a tied parameter's)


@dataclass
class ForwardGraph:
    """A model's forward pass as Relax, with everything the training graph needs to know."""

    inputs: list[relax.Var]
    input_specs: list[TensorSpec]
    state: list[StateTensor]
    state_vars: dict[str, relax.Var]
    output: relax.Expr
    buffer_updates: dict[str, relax.Expr] = field(default_factory=dict)
    random_masks: list[RandomMask] = field(default_factory=list)
    # every state_dict name in model order, a tied tensor's aliases included (empty: the
    # names of `state`)
    state_names: list[str] = field(default_factory=list)

    def aliases(self) -> dict[str, str]:
        """{other name: state name} of the tensors that several modules share."""
        return {a: s.name for s in self.state for a in s.aliases}


def c_name(name: str) -> str:
    """A state tensor's Relax variable name."""
    return "p_" + "".join(c if c.isalnum() else "_" for c in name)


def c_ident(name: str) -> str:
    """A model input's name as a C identifier (it names a parameter of the C step)."""
    ident = "".join(c if c.isalnum() else "_" for c in name).strip("_") or "input"
    return ident if not ident[0].isdigit() else "in_" + ident


def emit_forward(ctx, inputs, input_specs, state, state_vars, body, extend=None):
    """Build the function "main". `body()` converts the graph inside the dataflow block and
    returns (model outputs, {buffer name: new value}). `extend(bb, graph)` returns
    (extra params, outputs); without it the function returns the model output."""
    bb = ctx.bb
    with bb.function("main"):
        with bb.dataflow():
            outputs, updates = body()
            if len(outputs) != 1:
                raise CompileError(
                    f"the model returns {len(outputs)} tensors; ubitrain trains a model "
                    "with exactly one output tensor (the logits or prediction)")
            graph = ForwardGraph(inputs=inputs, input_specs=input_specs, state=state,
                                 state_vars=state_vars, output=outputs[0],
                                 buffer_updates=updates, random_masks=ctx.random_masks)
            extra_params, results = extend(bb, graph) if extend else ([], [graph.output])
            results = [bb.emit_output(r) for r in results]
        params = inputs + extra_params + [state_vars[s.name] for s in state]
        params += [mask.var for mask in ctx.random_masks]
        bb.emit_func_output(relax.Tuple(results) if len(results) > 1 else results[0],
                            params=params)
    return bb.get(), graph
