"""The optimizer update as calls of the step: one in-place kernel per trained parameter
(the new parameter and optimizer state written over the old, element by element), after
one call that computes the step's coefficients (learning rate schedules, bias corrections).

`place_early` moves each update right after the last use of its parameter and its gradient,
so that gradients of the whole model never need to coexist (TinyEngine's in-place update).
"""

from __future__ import annotations

import numpy as np
from tvm import te

from .ir import Call, Slot, users


def optimizer_calls(tm, optimizer, library, state, parts, opt_state, grads):
    """(the coefficients call, the update calls), or (None, []) when nothing trains."""
    if not tm.trainable:
        return None, []
    coef_code = optimizer.coefficient_code()
    # one more when clipping: the clipping coefficient (program/gradient_clipping.py)
    size = len(coef_code) + (clip_norm(optimizer) is not None)
    coef = Slot("optimizer_coefficients", (size,), "float32", "coefficients",
                np.zeros(size, "float32"))
    coef_call = Call("ub_optimizer_coefficients", [coef], [0], builtin=True,
                     attrs={"code": coef_code})
    updates = []
    for name, grad in zip(tm.trainable, grads):
        param, states = parts.get(name) or state[name], opt_state[name]
        # what else the rule reads (NITI: a weight's exponents per channel), by the name of
        # the weight a part trained by channels belongs to
        owner = param.view_of.label if param.view_of is not None else name
        inputs = getattr(optimizer, "update_inputs", lambda n, s: [])(owner, state)
        func = update_prim_func(optimizer, param.shape, len(states), coef, param.dtype,
                                grad.dtype, inputs)
        # In place: the new parameter and state overwrite the old, element by element.
        kernel = library.add(func, f"{type(optimizer).__name__.lower()}_update",
                             update_aliases(len(states), len(inputs)))
        args = [param, grad] + states + [coef] + inputs + [param] + states
        scratch = Slot(f"scratch_update_{len(updates)}", (kernel.scratch_bytes,), "uint8",
                       "scratch") if kernel.scratch_bytes else None  # NITI's reductions
        updates.append(Call(kernel.name, args, sorted(kernel.written), attrs={"param": name},
                            scratch=scratch))
    return coef_call, updates


def clip_norm(optimizer) -> float | None:
    """`clip_grad_norm=` of ub.SGD / Adam / AdamW (NITI has none)."""
    return getattr(optimizer, "clip_grad_norm", None)


def place_early(calls: list[Call], updates: list[Call]) -> list[Call]:
    """Insert each update just after the last use of its parameter and its gradient."""
    merged = list(calls)
    for upd in updates:
        param, grad = upd.args[0], upd.args[1]
        merged.insert(max(_last_use(merged, param.root), _last_use(merged, grad.root)) + 1, upd)
    return merged


def block_update_kernel(optimizer, library, elements: int, n_states: int, coef):
    """The update kernel over `elements` consecutive elements (a block of weight rows)."""
    func = update_prim_func(optimizer, (elements,), n_states, coef)
    return library.add(func, f"{type(optimizer).__name__.lower()}_update",
                       update_aliases(n_states))


def update_aliases(n_states: int, n_inputs: int = 0) -> dict[int, int]:
    """Arguments [param, grad] + states + [coef] + inputs + [param] + states: the new
    parameter and states are written over the old."""
    out = 3 + n_states + n_inputs
    return {0: out} | {2 + j: out + 1 + j for j in range(n_states)}


def update_prim_func(optimizer, shape, n_states: int, coef, dtype: str = "float32",
                     grad_dtype: str = "float32", inputs=()):
    p = te.placeholder(shape, dtype, "param")
    g = te.placeholder(shape, grad_dtype, "grad")
    st = [te.placeholder(shape, "float32", f"state{i}") for i in range(n_states)]
    c = te.placeholder(coef.shape, "float32", "coef")
    xs = [te.placeholder(x.shape, x.dtype, f"input{i}") for i, x in enumerate(inputs)]
    out = optimizer.update(p, g, st, c, *xs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return te.create_prim_func([p, g] + st + [c] + xs + outs)


def _last_use(calls, root) -> int:
    return max(users(calls, root), default=-1)
