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

The same forcing pins the referee's float32 runs to the float64 run's branches
(`SideReplay(pin=exact.decisions)`): wherever a float32 run's rounding put an element on the
other side of a kink, its backward takes float64's side, so the spread of those runs, which
sets every tolerance, is rounding alone. A run whose branch differs at an op that cannot be
forced (`unpinned`) does not measure rounding alone and is left out of the spread.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from .kinks import DecisionRecorder, Decisions
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
    """A DecisionRecorder that forces branches in the backward ops: at the near-kink elements
    (`near`: kinks.near_masks of this step), the C's side (from `c_tensors`, its forward) where
    this run's differs; at every element, `pin`'s branch (another run's Decisions, float64
    PyTorch's) where this run took another. `decisions.taken` holds the branches the run's
    backward took after forcing: what a run pinned to this one must take.

    `flip` (per call, elements or None) puts those elements on another side than the one they
    would take, wherever the C's side is not known: what a kink flip there can do to the
    step (referee.py bounds a near-kink excuse by it). A flip it cannot force is listed in
    `unflipped`."""

    def __init__(self, c_tensors: list[np.ndarray] | None = None,
                 near: list[np.ndarray | None] | None = None, pin: Decisions | None = None,
                 flip: list[np.ndarray | None] | None = None):
        super().__init__()
        self.c_tensors, self.near, self.pin = c_tensors, near or [], pin
        self.flip = flip or []
        self.unflipped: list[str] = []  # op calls with elements to flip and no rule to force
        self.forced: dict = {}  # key of the tensor a backward op reads -> its replacement
        self.replayed = 0  # elements forced to the C's side
        self.pinned = 0  # elements forced to the pinned run's branch
        self.unreplayed: list[str] = []  # near-kink op calls this could not replay
        # op calls where this run took another branch than `pin` and could not be forced:
        # the run does not measure rounding alone
        self.unpinned: list[str] = []
        self.differs: list[np.ndarray | None] = []  # per call: where it differed from `pin`

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _BACKWARD:
            position = _BACKWARD[func]
            replacement = self.forced.get(_key(args[position]))
            if replacement is not None:
                args = (*args[:position], replacement, *args[position + 1:])
        call = len(self.decisions.ops)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.decisions.ops) > call:
            with torch.no_grad():
                self._settle(func, call, args, out)
        return out

    def _settle(self, func, call, args, out):
        """The branches call `call` must take (the pin's, the C's at near-kink elements),
        forced where this run took others."""
        own = self.decisions.taken[call]
        self.differs.append(None)
        flip = self.flip[call] if call < len(self.flip) else None
        if own is None:
            if call < len(self.near) and self.near[call] is not None:
                self.unreplayed.append(f"{func}: {int(self.near[call].sum())} near-kink elements")
            if flip is not None:
                self.unflipped.append(f"{func}: {int(flip.sum())} elements")
            return
        want, pinned = own, 0
        pin = self.pin
        if pin is not None and call < len(pin.ops) and pin.ops[call] == str(func) and \
                pin.taken[call] is not None and tuple(pin.taken[call].shape) == tuple(own.shape):
            want = pin.taken[call].to(own.dtype)
            differs = want != own
            pinned = int(differs.sum())
            if pinned:
                self.differs[call] = differs.numpy()
        rule = _SIDES.get(func)
        replayed, known = 0, False
        if self.c_tensors is not None and call < len(self.near) and self.near[call] is not None:
            c = None if rule is None else rule.c_side(self.c_tensors, args, out)
            if c is None:
                self.unreplayed.append(f"{func}: {int(self.near[call].sum())} near-kink elements")
            else:
                known = True
                near = torch.from_numpy(self.near[call]).reshape(own.shape)
                to_c = near & (c.to(own.dtype) != want)
                replayed = int((near & (c.to(own.dtype) != own)).sum())
                want = torch.where(to_c, c.to(own.dtype), want)
        if flip is not None and not known:
            if rule is None:
                self.unflipped.append(f"{func}: {int(flip.sum())} elements")
            else:
                other = rule.other_side(args, out, want).to(own.dtype)
                want = torch.where(torch.from_numpy(flip).reshape(own.shape), other, want)
        flipped = want != own
        if not bool(flipped.any()):
            self.decisions.taken[call] = own
            return
        if rule is None:
            self.unpinned.append(f"{func}: {int(flipped.sum())} elements")
            return
        read, replacement = rule.force(args, out, want, flipped)
        self.forced[_key(read)] = replacement
        self.decisions.taken[call] = want
        self.replayed += replayed
        self.pinned += pinned


class _Activation:
    """ReLU-like ops: the C's side of each element from its copy of the op's output (at or
    below `low`, between, at or above `high`); the backward op reads the input
    (`saves_input`) or the output, replaced by a value on the wanted side where they differ."""

    def __init__(self, low, high, saves_input):
        self.low, self.high, self.saves_input = low, high, saves_input

    def _side(self, t, args):
        lo, hi = self.low(args), self.high(args)
        return (t > lo).to(torch.int8) + (0 if hi is None else (t >= hi).to(torch.int8))

    def c_side(self, c_tensors, args, out):
        c = _find(c_tensors, out)
        return None if c is None else self._side(c, args)

    def other_side(self, args, out, side):
        """Each element's neighbouring side: across 0 for ReLU; for a clamp, from between
        its bounds to the nearer one, and from a bound to between."""
        hi = self.high(args)
        if hi is None:
            return 1 - side
        nearer = torch.where(out < (self.low(args) + hi) / 2, 0, 2).to(side.dtype)
        return torch.where(side == 1, nearer, torch.ones_like(side))

    def force(self, args, out, want, flipped):
        lo, hi = self.low(args), self.high(args)
        on_side = torch.tensor([lo, lo + 1.0] if hi is None else [lo, (lo + hi) / 2, hi],
                               dtype=out.dtype)  # a value on side 0, 1 (and 2)
        read = args[0] if self.saves_input else out
        return read, torch.where(flipped, on_side[want.long()], read)


class _MaxPool:
    """The C's window maxima from its copy of the pool's input (first maximum in scan order,
    as both take it); the backward reads the indices, replaced where the wanted ones differ."""

    @staticmethod
    def c_side(c_tensors, args, out):
        c = _find(c_tensors, args[0])
        if c is None:
            return None
        return aten.max_pool2d_with_indices.default(c, *args[1:])[1]

    @staticmethod
    def other_side(args, out, side):
        """Each window's runner-up: the maximum once every window's maximum is out of the
        running (an element that is the maximum of an overlapping window too gives way to
        the next; any element of the window is a side a flip could take)."""
        x = args[0].detach().clone()
        flat = x.reshape(*x.shape[:-2], -1)
        flat.scatter_(-1, side.reshape(*side.shape[:-2], -1),
                      torch.full_like(flat, float("-inf")))
        return aten.max_pool2d_with_indices.default(flat.reshape(x.shape), *args[1:])[1]

    @staticmethod
    def force(args, out, want, flipped):
        return out[1], torch.where(flipped, want, out[1])


_RELU = dict(low=lambda a: 0.0, high=lambda a: None)
_HARDTANH = dict(low=lambda a: float(a[1]) if len(a) > 1 else -1.0,
                 high=lambda a: float(a[2]) if len(a) > 2 else 1.0)
# the ops whose branch can be forced, in the backward op that reads it
_SIDES = {
    aten.relu.default: _Activation(**_RELU, saves_input=False),
    aten.relu_.default: _Activation(**_RELU, saves_input=False),
    aten.hardtanh.default: _Activation(**_HARDTANH, saves_input=True),
    aten.hardtanh_.default: _Activation(**_HARDTANH, saves_input=False),
    aten.max_pool2d_with_indices.default: _MaxPool(),
}
# backward op -> the position of the argument that carries the forward's decision
_BACKWARD = {aten.threshold_backward.default: 1, aten.hardtanh_backward.default: 1,
             aten.max_pool2d_with_indices_backward.default: 7}
