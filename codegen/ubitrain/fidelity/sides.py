"""Decide a "near kink" verdict: replay the C's own side of each near-kink element in PyTorch.

A step whose check fails where elements sat near a kink (kinks.py) is undecided: the C may have
put some of them on the other side, a valid float32 result whose gradient differs. To decide,
the model is built again with a hook after every call (pipeline/instruments.py CallTrace) that keeps
each forward call's outputs (`ForwardCapture`). For every kink op of PyTorch's step, the C
tensor holding that op's output (ReLU, hardtanh / ReLU6, leaky ReLU, ELU / SELU, hardsigmoid:
where the output tells the side) or input (hardswish, clamp, abs, max pooling) is found by
value, and PyTorch's step runs again (`SideReplay`) with the C's side at the near-kink elements
where the two differ: forced in the backward op that reads the decision (threshold_backward,
leaky_relu_backward, ..., the comparisons of clamp's backward, the pool's indices; `_SIDES`),
the forward values left as they are, in float64 and in float32 alike. What still differs is
the C's own error.

Elements that are not near a kink are never forced: a C that takes the other side there is
wrong and is judged so. A near-kink op this cannot replay (another kind, or no C tensor holds
its values) leaves its step undecided.

The same forcing pins the referee's float32 runs to the float64 run's branches
(`SideReplay(pin=exact.decisions)`): wherever a float32 run's rounding put an element on the
other side of a kink, its backward takes float64's side, so the spread of those runs, which
sets every tolerance, is rounding alone. A run whose branch differs at an op that cannot be
forced (`unpinned`: a comparison, whose branch is a forward value; an op without a rule) does
not measure rounding alone and is left out of the spread.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes

from .kinks import BRANCH_BEFORE, DecisionRecorder, Decisions
from .trace import _value

aten = torch.ops.aten
MATCH = 1e-3  # a C tensor holds an op's tensor when max |c - t| <= MATCH * max |t|, or
# when it is the one tensor within LOOSE_MATCH, every other of its size SEPARATION times
# further: a BatchNorm over a few nearly equal values (batch 1, a 2x2 map) makes its output
# rounding-sensitive, and its C copy may differ by 1e-3 where no other tensor comes near
LOOSE_MATCH, SEPARATION = 5e-2, 10.0


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


def _match(tensors: list[np.ndarray], t: torch.Tensor) -> int | None:
    """The index of the C tensor holding the values of `t`; None if none does."""
    want = t.detach().double().reshape(-1).numpy()
    scale = max(float(np.max(np.abs(want), initial=0.0)), 1e-30)
    # the closest; of equals, the last (the newest copy of those values)
    errors = sorted((float(np.max(np.abs(c - want))) / scale, -i)
                    for i, c in enumerate(tensors) if c.size == want.size)
    if not errors:
        return None
    (best, minus_index), runner_up = errors[0], errors[1][0] if len(errors) > 1 else np.inf
    if best <= MATCH or (best <= LOOSE_MATCH and runner_up >= SEPARATION * best):
        return -minus_index
    return None


def _find(tensors: list[np.ndarray], t: torch.Tensor) -> torch.Tensor | None:
    """The C tensor holding the values of `t`, shaped and typed like it; None if none does."""
    i = _match(tensors, t)
    return None if i is None else torch.from_numpy(tensors[i].reshape(t.shape)).to(t.dtype)


def _key(t: torch.Tensor):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


class _Forced:
    """A tensor a backward op reads, replaced (`value`) to take the wanted branches; `nodes`:
    the autograd nodes whose ops may read it (None: any, the op being a backward op)."""

    def __init__(self, value, nodes, op):
        self.value, self.nodes, self.op, self.read = value, nodes, op, False


def _node() -> str | None:
    node = torch._C._current_autograd_node()
    return None if node is None else node.name()


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
        self.forced: dict = {}  # key of the tensor a backward op reads -> _Forced
        self.replayed = 0  # elements forced to the C's side
        self.pinned = 0  # elements forced to the pinned run's branch
        self.unreplayed: list[str] = []  # near-kink op calls this could not replay
        # op calls where this run took another branch than `pin` and could not be forced:
        # the run does not measure rounding alone
        self.unpinned: list[str] = []
        self.differs: list[np.ndarray | None] = []  # per call: where it differed from `pin`
        # (key of its input, output) of the last clone: the copy autograd saves of an in-place
        # op's input (clamp_, hardtanh_, hardswish_ ...), dispatched right before the op
        self._clone = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for position in _BACKWARD.get(func, ()):
            entry = self.forced.get(_key(args[position]))
            if entry is not None and (entry.nodes is None or _node() in entry.nodes):
                args = (*args[:position], entry.value, *args[position + 1:])
                entry.read = True
        call = len(self.decisions.ops)
        grad = torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                               for a in args)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.decisions.ops) > call:
            # the modes below this one (reference._RoundingNoise: an ulp on every result)
            # must not move the values forced onto a piece off it
            with torch.no_grad(), _disable_current_modes():
                self._settle(func, call, args, out, grad)
        if func is aten.clone.default:
            self._clone = (_key(args[0]), out)
        return out

    def __exit__(self, *exc):
        # a forcing no backward op read (autograd saved another tensor than the rule keys):
        # the run took its own branch there after all
        self._unforced([f"{e.op}: forced, not read by its backward"
                        for e in self.forced.values() if not e.read])
        return super().__exit__(*exc)

    def _unforced(self, ops):
        self.unpinned += ops
        self.unflipped += ops
        if self.c_tensors is not None:
            self.unreplayed += ops

    def _settle(self, func, call, args, out, grad):
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
        saved = self._clone[1] if self._clone and self._clone[0] == _key(args[0]) else None
        read = None if rule is None else rule.read(args, out, saved)
        replayed, known = 0, False
        if self.c_tensors is not None and call < len(self.near) and self.near[call] is not None:
            c = None if rule is None else rule.c_side(func, self.c_tensors, args, out, saved)
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
                other = rule.other(args, read if read is not None else out, want)
                want = torch.where(torch.from_numpy(flip).reshape(own.shape),
                                   other.to(own.dtype), want)
        flipped = want != own
        if not bool(flipped.any()):
            self.decisions.taken[call] = own
            return
        if rule is None:
            self.unpinned.append(f"{func}: {int(flipped.sum())} elements")
            return
        if grad:  # else no backward reads it: the branch reaches no gradient
            value = None if read is None else rule.force(args, read, want, flipped)
            if value is None or _key(read) in self.forced:  # (two ops reading one tensor)
                self._unforced([f"{func}: {int(flipped.sum())} elements, no faithful forcing"])
                return
            self.forced[_key(read)] = _Forced(value, rule.nodes, str(func))
        self.decisions.taken[call] = want
        self.replayed += replayed
        self.pinned += pinned


def _across(args, x, side):
    return 1 - side


def _signs(args, x, side):
    """A three-valued sign (below, at, above the kink): below to above, else to below."""
    return torch.where(side == 0, 2, 0).to(side.dtype)


def _to_bounds(center):
    """A middle piece between two bounds: to the nearer bound; from a bound, to the middle."""
    def other(args, x, side):
        nearer = torch.where(x < center(args), 0, 2).to(side.dtype)
        return torch.where(side == 1, nearer, torch.ones_like(side))
    return other


class _Piecewise:
    """An op whose derivative is piecewise, its pieces kinks.BRANCH_BEFORE's: its backward
    picks each element's piece from one tensor it reads (`reads`: the op's "input", its
    "output", or the copy of the input autograd "saved" before an in-place op overwrote it),
    here replaced where another piece is wanted by `points(args, x)[piece]`, a value on that
    piece (None: no faithful one). Where the derivative is constant on a piece any value on
    it is exact; where it varies (ELU's exp, hardswish's x/3 + 1/2) the point is the piece's
    nearest to the element, its bound. Only elements across the kink from the run they are
    forced to match are ever forced, so that bound lies between the two: nearer the wanted
    run's element than this run's own rounding put it.

    The C's side: from its copy of the output (`from_output(c, args)`, where that tells the
    side apart; None where it does not), else from its copy of the input (as the backward
    reads it: `by_input`), when its output was not taken for it. `nodes`: the autograd nodes
    whose comparisons read the tensor, for an op whose backward is composite (clamp's
    x >= min): the same comparison elsewhere is left alone."""

    def __init__(self, points, reads="input", from_output=None, by_input=True, other=_across,
                 nodes=None):
        self.points, self.reads, self.from_output = points, reads, from_output
        self.by_input, self.other, self.nodes = by_input, other, nodes

    def read(self, args, out, saved):
        return {"input": args[0], "output": out, "saved": saved}[self.reads]

    def force(self, args, x, want, flipped):
        points = self.points(args, x)
        if points is None:
            return None
        value = torch.as_tensor(points[-1], dtype=x.dtype)
        for piece in range(len(points) - 2, -1, -1):
            value = torch.where(want == piece, torch.as_tensor(points[piece], dtype=x.dtype),
                                value)
        return torch.where(flipped, value, x)

    def c_side(self, func, c_tensors, args, out, saved):
        if self.from_output is not None:
            c = _find(c_tensors, out)
            side = None if c is None else self.from_output(c, args)
            if side is not None:
                return side.to(torch.int8)
        x = saved if self.reads == "saved" else args[0] if self.reads == "input" else None
        if not self.by_input or x is None:
            return None
        i = _match(c_tensors, x)
        if i is None or (i == _match(c_tensors, out) and not torch.equal(x, out)):
            return None  # (its input is not among the C's tensors: its output matched)
        c = torch.from_numpy(c_tensors[i].reshape(x.shape)).to(x.dtype)
        return BRANCH_BEFORE[func]((c, *args[1:]))


class _MaxPool:
    """The C's window maxima from its copy of the pool's input (first maximum in scan order,
    as both take it); the backward reads the indices, replaced where the wanted ones differ."""

    nodes = None

    @staticmethod
    def read(args, out, saved):
        return out[1]

    @staticmethod
    def c_side(func, c_tensors, args, out, saved):
        c = _find(c_tensors, args[0])
        if c is None:
            return None
        return aten.max_pool2d_with_indices.default(c, *args[1:])[1]

    @staticmethod
    def other(args, x, side):
        """Each window's runner-up: the maximum once every window's maximum is out of the
        running (an element that is the maximum of an overlapping window too gives way to
        the next; any element of the window is a side a flip could take)."""
        x = args[0].detach().clone()
        flat = x.reshape(*x.shape[:-2], -1)
        flat.scatter_(-1, side.reshape(*side.shape[:-2], -1),
                      torch.full_like(flat, float("-inf")))
        return aten.max_pool2d_with_indices.default(flat.reshape(x.shape), *args[1:])[1]

    @staticmethod
    def force(args, indices, want, flipped):
        return torch.where(flipped, want, indices)


def _arg(args, i, default):
    return float(args[i]) if len(args) > i and args[i] is not None else default


def _hardtanh_bounds(a):
    return _arg(a, 1, -1.0), _arg(a, 2, 1.0)


def _beyond(b):  # a value past bound b, whatever its magnitude
    return b + 1.0 + abs(b)


def _clamp_points(a, x):
    """clamp's pieces (x < lo, lo <= x <= hi, x > hi; a missing bound takes its piece away)."""
    lo, hi = _arg(a, 1, None), _arg(a, 2, None)
    if lo is not None and hi is not None:
        return None if lo > hi else [-_beyond(-lo), lo, _beyond(hi)]
    return [-_beyond(-lo), lo] if hi is None else [hi, _beyond(hi)]


def _sign_points(a, x):  # a three-valued sign of x - bound: below, at, above
    b = float(a[1])
    return [-_beyond(-b), b, _beyond(b)]


def _other_points(a, x):  # maximum / minimum: self below, at, above other
    o = a[1].to(x.dtype)
    return [torch.nextafter(o, o.new_tensor(-float("inf"))), o,
            torch.nextafter(o, o.new_tensor(float("inf")))]


def _inside(x, bound):  # the float of x's dtype next to `bound`, towards 0
    b = torch.tensor(bound, dtype=x.dtype)
    return torch.nextafter(b, torch.zeros_like(b))


def _positive(c, a):
    return c > 0


_RELU = _Piecewise(lambda a, x: [0.0, 1.0], "output", _positive)
_HARDTANH = dict(
    points=lambda a, x: [_hardtanh_bounds(a)[0], sum(_hardtanh_bounds(a)) / 2,
                         _hardtanh_bounds(a)[1]],
    from_output=lambda c, a: ((c > _hardtanh_bounds(a)[0]).to(torch.int8)
                              + (c >= _hardtanh_bounds(a)[1]).to(torch.int8)),
    other=_to_bounds(lambda a: sum(_hardtanh_bounds(a)) / 2))
# leaky ReLU's and ELU's output has the sign of the input for a positive slope / alpha (and
# scale); otherwise the side comes from the input
_LEAKY = dict(points=lambda a, x: [-1.0, 1.0],
              from_output=lambda c, a: _positive(c, a) if _arg(a, 1, 0.01) >= 0 else None)
_ELU = dict(points=lambda a, x: [x.clamp(max=0.0), 1.0],
            from_output=lambda c, a: _positive(c, a) if min(_arg(a, 1, 1.0), _arg(a, 2, 1.0),
                                                            _arg(a, 3, 1.0)) > 0 else None)
# hardsigmoid: 0 at or below -3, 1 at or above 3, as its backward's open middle (the C's
# side from its output)
_HARDSIGMOID = dict(points=lambda a, x: [-3.0, 0.0, 3.0],
                    from_output=lambda c, a: (c > 0).to(torch.int8) + (c >= 1).to(torch.int8),
                    other=_to_bounds(lambda a: 0.0))
# hardswish's middle piece (x/3 + 1/2) is open: its point nearest the element is a float
# next to a bound, inside
_HARDSWISH = dict(points=lambda a, x: [-3.0, torch.minimum(torch.maximum(x, _inside(x, -3.0)),
                                                           _inside(x, 3.0)), 3.0],
                  other=_to_bounds(lambda a: 0.0))


def _clamp_other(args, x, side):
    lo, hi = _arg(args, 1, None), _arg(args, 2, None)
    if lo is None or hi is None:
        return 1 - side
    return _to_bounds(lambda a: (lo + hi) / 2)(args, x, side)


_CLAMP = dict(points=_clamp_points, other=_clamp_other, nodes={"ClampBackward1"})
# the ops whose branch can be forced, in the backward op that reads it; an in-place form
# whose autograd saves its input ("saved") reads that copy
_SIDES = {
    aten.relu.default: _RELU,
    aten.relu_.default: _RELU,
    aten.hardtanh.default: _Piecewise(**_HARDTANH),
    aten.hardtanh_.default: _Piecewise(**_HARDTANH, reads="saved"),
    aten.leaky_relu.default: _Piecewise(**_LEAKY),
    aten.leaky_relu_.default: _Piecewise(**_LEAKY, reads="output"),
    aten.elu.default: _Piecewise(**_ELU),  # SELU too: it dispatches to elu
    aten.elu_.default: _Piecewise(**_ELU, reads="output"),
    aten.hardsigmoid.default: _Piecewise(**_HARDSIGMOID),
    aten.hardsigmoid_.default: _Piecewise(**_HARDSIGMOID, reads="saved"),
    aten.hardswish.default: _Piecewise(**_HARDSWISH),
    aten.hardswish_.default: _Piecewise(**_HARDSWISH, reads="saved"),
    aten.clamp.default: _Piecewise(**_CLAMP),
    aten.clamp_.default: _Piecewise(**_CLAMP, reads="saved"),
    aten.abs.default: _Piecewise(lambda a, x: [-1.0, 0.0, 1.0], other=_signs,
                                 nodes={"AbsBackward0"}),
    aten.abs_.default: _Piecewise(lambda a, x: [-1.0, 0.0, 1.0], "saved", other=_signs,
                                  nodes={"AbsBackward0"}),
    aten.max_pool2d_with_indices.default: _MaxPool(),
}
for _op, _node_name in (("clamp_min", "ClampMinBackward0"), ("clamp_max", "ClampMaxBackward0")):
    _SIDES[getattr(aten, _op).default] = _Piecewise(_sign_points, other=_signs,
                                                    nodes={_node_name})
    _SIDES[getattr(aten, _op + "_").default] = _Piecewise(_sign_points, "saved", other=_signs,
                                                          nodes={_node_name})
for _op, _node_name in ((aten.maximum.default, "MaximumBackward0"),
                        (aten.minimum.default, "MinimumBackward0")):
    # the C's side would need both of its inputs: not replayed
    _SIDES[_op] = _Piecewise(_other_points, by_input=False, other=_signs, nodes={_node_name})
# backward op -> the positions of the arguments that carry the forward's decision (the
# comparisons: only within the `nodes` of the rule that forced them)
_BACKWARD = {aten.threshold_backward.default: (1,), aten.hardtanh_backward.default: (1,),
             aten.max_pool2d_with_indices_backward.default: (7,),
             aten.leaky_relu_backward.default: (1,), aten.elu_backward.default: (5,),
             aten.hardsigmoid_backward.default: (1,), aten.hardswish_backward.default: (1,),
             aten.sgn.default: (0,), aten.ge.Scalar: (0,), aten.le.Scalar: (0,),
             aten.eq.Tensor: (0,), aten.gt.Tensor: (0,), aten.lt.Tensor: (0,)}
