"""Decide a "near kink" verdict: replay the C's own side of each near-kink element in PyTorch.

A step whose check fails where elements sat near a kink (kinks.py) is undecided: the C may have
put some of them on the other side, a valid float32 result whose gradient differs. To decide,
the model is built again with a hook after every call (pipeline/instruments.py CallTrace) that keeps
each forward call's outputs (`ForwardCapture`). For every kink op of PyTorch's step, the C
tensor holding that op's output (ReLU, ReLU6 / hardtanh) or input (max pooling) is found by
value, and PyTorch's step runs again (`SideReplay`) with the C's side at the near-kink elements
where the two differ: forced in the backward op that reads the decision (threshold_backward,
hardtanh_backward, the pool's indices), the forward values left as they are, in float64 and
in float32 alike. What still differs is the C's own error.

Elements that are not near a kink are never forced: a C that takes the other side there is
wrong and is judged so. A near-kink op this cannot replay (another kind, or no C tensor holds
its values) leaves its step undecided.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from .kinks import DecisionRecorder
from .trace import _value

aten = torch.ops.aten
MATCH = 1e-3  # a C tensor holds an op's tensor when max |c - t| <= MATCH * max |t|


class ForwardCapture:
    """The outputs of every forward call of each train step of a trainer compiled with the
    CallTrace instrument, as float64 arrays: `steps[-1]` is the last step's."""

    def __init__(self, trainer, pkg):
        calls = pkg.programs["train_step"].calls
        loss_check = next((i for i, c in enumerate(calls) if c.kernel == "ub_check_loss"),
                          len(calls))
        plan, self.steps = pkg.memory_plan, []
        outputs = {i: [c.args[k] for k in c.outputs if c.args[k].dtype == "float32"
                       and not c.args[k].root.external]
                   for i, c in enumerate(calls[:loss_check])}

        def hook(program, index, arena):
            if program != 0 or index not in outputs:
                return
            if index == 0:
                self.steps.append([])
            view = np.ctypeslib.as_array((ctypes.c_uint8 * plan.arena_bytes).from_address(arena))
            self.steps[-1] += [_value(s, view, plan, {}).astype(np.float64).reshape(-1)
                               for s in outputs[index]]

        self._callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint32,
                                          ctypes.c_void_p)(hook)
        self._pointer = ctypes.c_void_p.in_dll(trainer.lib, f"ub_{pkg.model_name}_trace")
        self._pointer.value = ctypes.cast(self._callback, ctypes.c_void_p).value

    def close(self):
        self._pointer.value = None


def _find(tensors: list[np.ndarray], t: torch.Tensor) -> torch.Tensor | None:
    """The C tensor holding the values of `t`, shaped and typed like it; None if none does."""
    want = t.detach().double().reshape(-1).numpy()
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
    best, error = None, MATCH
    for c in tensors:
        if c.size == want.size:
            e = float(np.max(np.abs(c - want))) / scale
            if e <= error:
                best, error = c, e
    return None if best is None else torch.from_numpy(best.reshape(t.shape)).to(t.dtype)


def _key(t: torch.Tensor):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


class SideReplay(DecisionRecorder):
    """A DecisionRecorder that also forces, in the backward ops, the C's side of the
    near-kink elements (`near`: kinks.near_masks of this step) where this run's differs."""

    def __init__(self, c_tensors: list[np.ndarray], near: list[np.ndarray | None]):
        super().__init__()
        self.c_tensors, self.near = c_tensors, near
        self.forced: dict = {}  # key of the tensor a backward op reads -> its replacement
        self.replayed = 0  # elements forced to the C's side
        self.unreplayed: list[str] = []  # near-kink op calls this could not replay

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BACKWARD:
            position = _BACKWARD[func]
            replacement = self.forced.get(_key(args[position]))
            if replacement is not None:
                args = (*args[:position], replacement, *args[position + 1:])
        call = len(self.decisions.ops)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.decisions.ops) > call and call < len(self.near) and \
                self.near[call] is not None:
            with torch.no_grad():
                self._plan(func, call, args, out)
        return out

    def _plan(self, func, call, args, out):
        near = torch.from_numpy(self.near[call])
        rule = _SIDES.get(func)
        forced = None if rule is None else rule(self.c_tensors, near, args, out)
        if forced is None:
            self.unreplayed.append(f"{func}: {int(near.sum())} near-kink elements")
            return
        key_tensor, replacement, flipped = forced
        if flipped:
            self.forced[_key(key_tensor)] = replacement
            self.replayed += flipped


def _activation(low, high, saves_input):
    """ReLU-like ops: the C's side of each element from its copy of the op's output (at or
    below `low`, between, at or above `high`); the backward op reads the input
    (`saves_input`) or the output, replaced by a value on the C's side where they differ."""
    def rule(c_tensors, near, args, out):
        lo, hi = low(args), high(args)
        c = _find(c_tensors, out)
        if c is None:
            return None
        on_side = torch.tensor([lo, lo + 1.0] if hi is None else [lo, (lo + hi) / 2, hi],
                               dtype=out.dtype)  # a value on side 0, 1 (and 2)

        def side(t):
            return (t > lo).long() + (0 if hi is None else (t >= hi).long())

        flip = near & (side(c) != side(out))
        read = args[0] if saves_input else out
        return read, torch.where(flip, on_side[side(c)], read), int(flip.sum())
    return rule


def _max_pool(c_tensors, near, args, out):
    """The C's window maxima from its copy of the pool's input (first maximum in scan order,
    as both take it), replacing PyTorch's indices where a near tie went the other way."""
    c = _find(c_tensors, args[0])
    if c is None:
        return None
    c_indices = aten.max_pool2d_with_indices.default(c, *args[1:])[1]
    flip = near.reshape(c_indices.shape) & (c_indices != out[1])
    return out[1], torch.where(flip, c_indices, out[1]), int(flip.sum())


_RELU = dict(low=lambda a: 0.0, high=lambda a: None)
_HARDTANH = dict(low=lambda a: float(a[1]) if len(a) > 1 else -1.0,
                 high=lambda a: float(a[2]) if len(a) > 2 else 1.0)
_SIDES = {
    aten.relu.default: _activation(**_RELU, saves_input=False),
    aten.relu_.default: _activation(**_RELU, saves_input=False),
    aten.hardtanh.default: _activation(**_HARDTANH, saves_input=True),
    aten.hardtanh_.default: _activation(**_HARDTANH, saves_input=False),
    aten.max_pool2d_with_indices.default: _max_pool,
}
# backward op -> the position of the argument that carries the forward's decision
_BACKWARD = {aten.threshold_backward.default: 1, aten.hardtanh_backward.default: 1,
             aten.max_pool2d_with_indices_backward.default: 7}
