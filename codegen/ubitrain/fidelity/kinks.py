"""Where a model's gradient jumps: the elements that sit close to a kink of the op reading them.

ReLU, its clamps and the max of a pooling window have a derivative that jumps (at 0, at the
clamp's bounds, where two window elements tie). Two correct float32 programs that round
differently may put such an element on either side of its kink and then back-propagate
different, equally valid gradients: a difference that says nothing about correctness. So
the referee records, for every such op a PyTorch run executes, each element's distance to
its nearest kink (`DecisionRecorder`, a dispatch mode over ATen ops), and a run of the same
step in float32 says how far rounding moves those distances. An element nearer its kink
than `MARGIN` times that (per op call) is "near a kink": a difference there is not judged.

Exact ties (distance 0 in float64 and float32 alike, such as ReLU's zeros meeting in a
max-pool window) are resolved the same way by every implementation (the first element in
scan order wins) and are not near a kink.

The recorder also keeps the branch each element took (`Decisions.taken`: the piece of the
op's derivative it sits on, or the window element a max picked), so that two runs can be
told apart where they decided differently: the referee pins its float32 runs to float64's
branches (sides.py), and a tolerance then measures rounding, never a kink.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten
MARGIN = 16.0  # an element is safe when this many rounding spreads away from its kink
FLOAT32_EPS = float(np.finfo(np.float32).eps)


# the ops whose output value jumps at its kink, not only its derivative (a comparison's 0 or 1;
# the index max.dim returns; threshold, unless its value is its threshold as in ReLU): near
# such an element even the forward of two correct float32 programs may differ by a whole
# step. At the others (ReLU, clamps, the pools' maxima) the value is continuous: a near-kink
# element moves the forward by rounding alone.
VALUE_JUMPS = frozenset(str(getattr(getattr(aten, cmp), overload)) for cmp in
                        ("gt", "lt", "ge", "le") for overload in ("Tensor", "Scalar")) | \
    {str(aten.max.dim), str(aten.threshold.default), str(aten.threshold_.default)}


def _pair(v):
    v = [v] if isinstance(v, int) else list(v)
    return v * 2 if len(v) == 1 else v


def _window_gaps(x, kernel, stride, padding, dilation, out_hw):
    """Per pooling window, its largest element minus its second largest (inf: no second)."""
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride or kernel)
    ph, pw = _pair(padding)
    dh, dw = _pair(dilation)
    n, c, h, w = x.shape
    oh, ow = out_hw
    if kh * kw == 1:
        return torch.full((n, c, oh, ow), float("inf"), dtype=x.dtype)
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    xp = F.pad(x, (pw, max(pw, need_w - w - pw), ph, max(ph, need_h - h - ph)),
               value=float("-inf"))
    cols = F.unfold(xp.reshape(n * c, 1, *xp.shape[2:]), (kh, kw), dilation=(dh, dw),
                    stride=(sh, sw))
    rows = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    cols = cols.reshape(n * c, kh * kw, rows, -1)[:, :, :oh, :ow]
    top = cols.topk(2, dim=1).values
    gap = top[:, 0] - top[:, 1]
    return gap.nan_to_num(posinf=float("inf")).reshape(n, c, oh, ow)


def _adaptive_window_gaps(x, out_hw):
    """`_window_gaps` for an adaptive max pool: window (i, j) covers rows
    [floor(i * H / OH), ceil((i + 1) * H / OH)), likewise columns."""
    x = x if x.dim() == 4 else x.unsqueeze(0)
    (h, w), (oh, ow) = x.shape[-2:], out_hw
    gaps = torch.empty(*x.shape[:2], oh, ow, dtype=x.dtype)
    for i in range(oh):
        for j in range(ow):
            window = x[..., i * h // oh:-(-(i + 1) * h // oh), j * w // ow:-(-(j + 1) * w // ow)]
            gaps[..., i, j] = _top2_gap(window, [2, 3])
    return gaps


def _top2_gap(x, dims, keepdim=False):
    dims = [d % x.dim() for d in ([dims] if isinstance(dims, int) else dims)] or \
        list(range(x.dim()))
    rest = [d for d in range(x.dim()) if d not in dims]
    flat = x.permute(*rest, *dims).reshape(*[x.shape[d] for d in rest], -1)
    if flat.shape[-1] < 2:
        return torch.full(flat.shape[:-1], float("inf"), dtype=x.dtype)
    top = flat.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def _bounds(x, *bounds):
    """Distance to the nearest of the given bounds (None: no bound)."""
    d = torch.full_like(x, float("inf"))
    for b in bounds:
        if b is not None:
            d = torch.minimum(d, (x - b).abs())
    return d


def _elu(a):
    """ELU's slope at 0 jumps from alpha * input_scale (times scale) to 1 (times scale):
    with alpha * input_scale = 1 (the default ELU) it has no kink."""
    alpha, _, input_scale = (list(a[1:]) + [1.0, 1.0, 1.0])[:3]
    return a[0] if alpha * input_scale != 1 else torch.full_like(a[0], float("inf"))


def _scalar(v):
    return float(v) if isinstance(v, (int, float)) else None


# aten op -> distance to the nearest kink of its derivative, from its arguments and output
DISTANCES = {
    aten.relu.default: lambda a, out: a[0],
    aten.threshold.default: lambda a, out: a[0] - a[1],
    aten.hardtanh.default: lambda a, out: _bounds(a[0], a[1] if len(a) > 1 else -1.0,
                                                   a[2] if len(a) > 2 else 1.0),
    aten.clamp.default: lambda a, out: _bounds(a[0], *[_scalar(v) for v in a[1:3]]),
    aten.clamp_min.default: lambda a, out: a[0] - a[1],
    aten.clamp_max.default: lambda a, out: a[0] - a[1],
    aten.hardswish.default: lambda a, out: _bounds(a[0], -3.0, 3.0),
    aten.hardsigmoid.default: lambda a, out: _bounds(a[0], -3.0, 3.0),
    aten.leaky_relu.default: lambda a, out: a[0],
    aten.elu.default: lambda a, out: _elu(a),
    aten.selu.default: lambda a, out: a[0],  # CELU's slope is 1 on both sides of 0: no kink
    aten.abs.default: lambda a, out: a[0],
    aten.maximum.default: lambda a, out: a[0] - a[1],
    aten.minimum.default: lambda a, out: a[0] - a[1],
    aten.max_pool2d_with_indices.default: lambda a, out: _window_gaps(
        a[0] if a[0].dim() == 4 else a[0].unsqueeze(0), a[1], a[2] if len(a) > 2 else (),
        a[3] if len(a) > 3 else 0, a[4] if len(a) > 4 else 1, out[0].shape[-2:]),
    aten.adaptive_max_pool2d.default: lambda a, out: _adaptive_window_gaps(a[0],
                                                                            out[0].shape[-2:]),
    aten.max.dim: lambda a, out: _top2_gap(a[0], a[1]),
    aten.amax.default: lambda a, out: _top2_gap(a[0], a[1] if len(a) > 1 else []),
    aten.max.default: lambda a, out: _top2_gap(a[0], []),
}
for _cmp in ("gt", "lt", "ge", "le"):
    for _overload in ("Tensor", "Scalar"):
        DISTANCES[getattr(getattr(aten, _cmp), _overload)] = lambda a, out: a[0] - a[1]
# The in-place forms (nn.ReLU(inplace=True), torchvision's ReLU6): measured on the input
# before the op overwrites it, so their rules must not read `out`.
IN_PLACE = {getattr(aten, f"{op}_").default: DISTANCES[getattr(aten, op).default]
            for op in ("relu", "threshold", "hardtanh", "clamp", "clamp_min", "clamp_max",
                       "hardswish", "hardsigmoid", "leaky_relu", "elu", "selu", "abs")}


def _piece(x, *cuts):
    """Which piece of a piecewise derivative each element of `x` sits on: the number of
    `cuts` (bound, closed) it is past, a bound counting when x > bound, or x >= bound where
    closed (None: no such bound), as the op's backward decides."""
    side = torch.zeros(x.shape, dtype=torch.int8)
    for bound, closed in cuts:
        if bound is not None:
            side += (x >= bound if closed else x > bound).to(torch.int8)
    return side


def _sign(d):
    return (torch.sign(d) + 1).to(torch.int8)


def _maxima(x, out, dims, keepdim):
    """Which elements of `x` are the maximum `out` of their slice (amax, max): the
    gradient goes to them."""
    dims = [d % x.dim() for d in ([dims] if isinstance(dims, int) else dims)] or \
        list(range(x.dim()))
    if not keepdim:
        for d in sorted(dims):
            out = out.unsqueeze(d)
    return (x == out).to(torch.int8)


# aten op -> the branch of its derivative each element takes, from the arguments before the
# op ran (the in-place forms overwrite them). Cuts as the backward kernels draw them:
# threshold_backward passes x > 0, hardtanh_backward lo < x < hi, clamp's lo <= x <= hi,
# hardswish_backward's and hardsigmoid_backward's middle piece -3 < x < 3 (PyTorch 2: at -3
# hardswish's gradient is 0, at 3 it is 1).
BRANCH_BEFORE = {
    "relu": lambda a: _piece(a[0], (0.0, False)),
    "threshold": lambda a: _piece(a[0], (float(a[1]), False)),
    "hardtanh": lambda a: _piece(a[0], (float(a[1]) if len(a) > 1 else -1.0, False),
                                 (float(a[2]) if len(a) > 2 else 1.0, True)),
    "clamp": lambda a: _piece(a[0], (_scalar(a[1]) if len(a) > 1 else None, True),
                              (_scalar(a[2]) if len(a) > 2 else None, False)),
    "clamp_min": lambda a: _sign(a[0] - a[1]),
    "clamp_max": lambda a: _sign(a[0] - a[1]),
    "hardswish": lambda a: _piece(a[0], (-3.0, False), (3.0, True)),
    "hardsigmoid": lambda a: _piece(a[0], (-3.0, False), (3.0, True)),
    "leaky_relu": lambda a: _piece(a[0], (0.0, False)),
    "elu": lambda a: _piece(a[0], (0.0, False)),
    "selu": lambda a: _piece(a[0], (0.0, False)),
    "abs": lambda a: _sign(a[0]),
}
BRANCH_BEFORE = {getattr(aten, name + suffix).default: rule
                 for name, rule in BRANCH_BEFORE.items() for suffix in ("", "_")}
for _op in (aten.maximum.default, aten.minimum.default):
    BRANCH_BEFORE[_op] = lambda a: _sign(a[0] - a[1])
for _cmp in ("gt", "lt", "ge", "le"):
    for _overload in ("Tensor", "Scalar"):
        BRANCH_BEFORE[getattr(getattr(aten, _cmp), _overload)] = lambda a: _sign(a[0] - a[1])
# ... and from the output: the window or slice element each max picked
BRANCH_AFTER = {
    aten.max_pool2d_with_indices.default: lambda a, out: out[1],
    aten.adaptive_max_pool2d.default: lambda a, out: out[1],
    aten.max.dim: lambda a, out: out[1],
    aten.amax.default: lambda a, out: _maxima(a[0], out, a[1] if len(a) > 1 else [],
                                              len(a) > 2 and a[2]),
    aten.max.default: lambda a, out: _maxima(a[0], out, [], False),
}


# Backward nodes whose comparisons repeat their forward op's decision (clamp's x >= min,
# maximum's x > y), recorded at that op: they are not kinks of their own, and sides.py
# forces that op's branch by replacing what they compare.
REPEATS = frozenset({"ClampBackward1", "ClampMinBackward0", "ClampMaxBackward0",
                     "MaximumBackward0", "MinimumBackward0"})
_COMPARISONS = frozenset(getattr(getattr(aten, cmp), overload) for cmp in ("gt", "lt", "ge", "le")
                         for overload in ("Tensor", "Scalar"))


def _repeats(func) -> bool:
    if func not in _COMPARISONS:
        return False
    node = torch._C._current_autograd_node()
    return node is not None and node.name() in REPEATS


@dataclass
class Decisions:
    """The kink distances of one run, one array per op call in execution order, and the
    branch each element took (`taken`, one tensor per call; None for an op without a rule)."""

    ops: list[str]
    distances: list[np.ndarray]
    taken: list = field(default_factory=list)


class DecisionRecorder(TorchDispatchMode):
    """Inside `with DecisionRecorder() as rec:`, every op of DISTANCES records its distances
    and its branches."""

    def __init__(self):
        super().__init__()
        self.decisions = Decisions([], [])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _repeats(func):
            return func(*args, **(kwargs or {}))
        # the branches and distances are computed without the modes below this one: a
        # variant's rounding noise (reference._RoundingNoise, an ulp on every result) on
        # x - y would make a tie of maximum(x, y) a branch its backward does not take
        with _disable_current_modes():
            before = self._branch(BRANCH_BEFORE.get(func), args)
            if func in IN_PLACE:
                self._record(func, IN_PLACE[func], args, None, before)
        out = func(*args, **(kwargs or {}))
        if func in DISTANCES:
            with _disable_current_modes():
                if func in BRANCH_AFTER:
                    before = self._branch(lambda a: BRANCH_AFTER[func](a, out), args)
                self._record(func, DISTANCES[func], args, out, before)
        return out

    @staticmethod
    def _branch(rule, args):
        if rule is None or not (isinstance(args[0], torch.Tensor)
                                and args[0].dtype.is_floating_point):
            return None
        with torch.no_grad():
            return rule(args).detach().clone()

    def _record(self, func, rule, args, out, taken):
        if isinstance(args[0], torch.Tensor) and args[0].dtype.is_floating_point:
            with torch.no_grad():
                d = rule(args, out)
            d = d if isinstance(d, torch.Tensor) else torch.as_tensor(d)
            self.decisions.ops.append(str(func))
            self.decisions.distances.append(d.detach().double().numpy().copy())
            self.decisions.taken.append(taken)


def near_kinks(exact: Decisions, rounded: Decisions) -> list[str]:
    """The op calls with elements nearer their kink than MARGIN rounding spreads: "op: k of
    n elements" each. `exact` comes from a float64 run, `rounded` from the same in float32."""
    if exact.ops != rounded.ops:
        return [f"the float32 run took other ops ({len(rounded.ops)} kink ops against "
                f"{len(exact.ops)})"]
    return [f"{op}: {int(near.sum())} of {near.size} elements"
            for op, near in zip(exact.ops, near_masks(exact, rounded)) if near is not None]


def value_jumps(exact: Decisions, rounded: Decisions, near: list) -> bool:
    """Whether the forward itself may differ by more than rounding between runs of `exact`'s
    step: an op of VALUE_JUMPS has near-kink elements (`near`, per call), or the float32
    run took other ops."""
    if exact.ops != rounded.ops:
        return True
    return any(m is not None and op in VALUE_JUMPS for op, m in zip(exact.ops, near))


def near_masks(exact: Decisions, rounded: Decisions) -> list[np.ndarray | None]:
    """Per op call of `exact` (same ops as `rounded`), which elements are near their kink;
    None for a call with none."""
    masks = []
    for d64, d32 in zip(exact.distances, rounded.distances):
        d64, d32 = np.broadcast_arrays(d64, d32)
        finite = np.isfinite(d64) & np.isfinite(d32)
        if not finite.any():
            masks.append(None)
            continue
        spread = float(np.max(np.abs(d32[finite] - d64[finite]), initial=0.0))
        scale = float(np.max(np.abs(d64[finite]), initial=0.0))
        reach = MARGIN * max(spread, 4 * FLOAT32_EPS * scale)
        tie = (d64 == 0) & (d32 == 0)
        near = finite & ~tie & (np.abs(d64) <= reach)
        masks.append(near if near.any() else None)
    return masks
