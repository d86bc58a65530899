"""Replaying the C's side of near-kink elements in PyTorch (fidelity/sides.py): the forced
side changes exactly the gradient PyTorch's own autograd gives for that side, and only at
elements near their kink."""

import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub
from ubitrain.fidelity.kinks import near_masks
from ubitrain.fidelity.reference import Reference
from ubitrain.fidelity.sides import SideReplay

W, B = 1 + 2 ** -15, -(1 + 2 ** -14)  # W * W + B: 2**-30 in float64, 0 in float32


class ReluNearZero(nn.Module):
    """fc's first output sits 2**-30 above ReLU's kink (float32 rounds it to the kink); its
    second is far from any kink."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(1, 2), nn.Linear(2, 2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[W], [1.0]]))
            self.fc.bias.copy_(torch.tensor([B, 0.0]))

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)))


class PoolNearTie(nn.Module):
    """A max pool whose one window holds two elements 1e-12 apart: a tie in float32."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1, 1, 1, 2))
        self.head = nn.Linear(1, 2)

    def forward(self, x):
        return self.head(nn.functional.max_pool2d(x * self.w, (1, 2)).flatten(1))


def _steps(model_class, x, c_tensors, near=None):
    """The float64 step as is, and with `c_tensors` as the C's forward (near: kinks.py's, or
    given); each the change of every parameter under SGD(lr=1), i.e. minus the gradient."""
    torch.manual_seed(0)  # the head's initial weights
    model = model_class()
    ref = Reference(model, ub.SGD(lr=1.0), "cross_entropy", [n for n, _ in
                                                             model.named_parameters()])
    state, batch = ref.initial_state(), (x, torch.tensor([1]))
    exact = ref.step(state, {}, 1, batch, 0, torch.float64, record=True)
    rounded = ref.step(state, {}, 1, batch, 0, torch.float32, record=True)
    replay = SideReplay(c_tensors, near if near is not None else
                        near_masks(exact.decisions, rounded.decisions))
    forced = ref.step(state, {}, 1, batch, 0, torch.float64, recorder=replay)
    change = {k: forced.state[k] - state[k] for k in state}
    return {k: exact.state[k] - state[k] for k in state}, change, replay


def test_the_c_side_of_a_relu_near_its_kink_is_replayed():
    x = torch.tensor([[W]])
    # the C's copy of the ReLU's output: its float32 result, 0 for the first element
    c = [np.array([0.0, W])]
    plain, forced, replay = _steps(ReluNearZero, x, c)
    assert replay.replayed == 1 and not replay.unreplayed
    assert plain["fc.weight"][0, 0] != 0  # float64 passes the gradient to the first output
    assert forced["fc.weight"][0, 0] == 0 and forced["fc.bias"][0] == 0  # the C's side stops it
    np.testing.assert_array_equal(forced["fc.weight"][1], plain["fc.weight"][1])


def test_an_element_far_from_its_kink_is_never_forced():
    """A C that put a far element on the other side is wrong: the replay leaves it, so the
    referee sees the difference."""
    x = torch.tensor([[W]])
    c = [np.array([W, 0.0])]  # the second output (1.00003, far from 0) on the wrong side
    near = [np.array([False, False])]
    plain, forced, replay = _steps(ReluNearZero, x, c, near)
    assert replay.replayed == 0
    for k in plain:
        np.testing.assert_array_equal(forced[k], plain[k])


def test_the_c_choice_in_a_near_tie_of_a_max_pool_is_replayed():
    x = torch.tensor([[[[1.0, 1.0 + 1e-12]]]], dtype=torch.float64)
    c = [np.array([1.0 + 1e-6, 1.0])]  # the C's pool input: its first element the larger
    plain, forced, replay = _steps(PoolNearTie, x, c)
    assert replay.replayed == 1
    assert plain["w"][..., 0] == 0 and plain["w"][..., 1] != 0
    # the gradient moves to the C's element: the same upstream gradient times x[0], not x[1]
    # (each change is w_new - w_old with w = 1, exact to a float64 rounding of 1)
    np.testing.assert_allclose(forced["w"][..., 0], plain["w"][..., 1] / (1 + 1e-12),
                               rtol=0, atol=4e-16)
    assert forced["w"][..., 1] == 0


def test_a_near_kink_op_without_a_c_tensor_stays_undecided():
    x = torch.tensor([[W]])
    _, _, replay = _steps(ReluNearZero, x, [np.array([5.0, -5.0])])  # matches nothing
    assert replay.replayed == 0 and replay.unreplayed


# ---- the float32 runs behind a tolerance take float64's branches (issue #39) ---------------
def test_a_float32_run_pinned_to_float64_takes_its_side_of_a_kink():
    """float32 rounds fc's first output onto ReLU's kink and stops its gradient; pinned to
    the float64 run's decisions, it passes it as float64 does."""
    torch.manual_seed(0)
    model = ReluNearZero()
    ref = Reference(model, ub.SGD(lr=1.0), "cross_entropy", [n for n, _ in
                                                             model.named_parameters()])
    state, batch = ref.initial_state(), (torch.tensor([[W]]), torch.tensor([1]))
    exact = ref.step(state, {}, 1, batch, 0, torch.float64, record=True)
    own = ref.step(state, {}, 1, batch, 0, torch.float32, record=True)
    pinned_run = SideReplay(pin=exact.decisions)
    pinned = ref.step(state, {}, 1, batch, 0, torch.float32, recorder=pinned_run)
    change = {name: {k: r.state[k] - state[k] for k in state}
              for name, r in (("exact", exact), ("own", own), ("pinned", pinned))}
    assert change["own"]["fc.weight"][0, 0] == 0  # float32's own side: no gradient
    assert pinned_run.pinned == 1 and not pinned_run.unpinned
    np.testing.assert_allclose(change["pinned"]["fc.weight"], change["exact"]["fc.weight"],
                               rtol=1e-6)


class _Float64Trainer:
    """A stand-in for a C trainer: float64 PyTorch's steps, in float32, with the change of
    `wrong` off by `error` (relative)."""

    def __init__(self, ref, wrong=None, error=0.0):
        self.ref, self.wrong, self.error = ref, wrong, error
        self.state, self.opt = ref.initial_state(), {}

    def step(self, *batch):
        r = self.ref.step(self.state, self.opt, 1, batch, 0, torch.float64)
        new = {k: v.astype(np.float32) for k, v in r.state.items()}
        if self.wrong:
            new[self.wrong] = (self.state[self.wrong] + (1 + self.error) * (
                r.state[self.wrong] - self.state[self.wrong])).astype(np.float32)
        self.state, self.opt = new, {k: v.astype(np.float32) for k, v in r.opt_state.items()}
        return np.float32(r.loss)

    def parameters(self):
        return dict(self.state)

    def optimizer_state(self):
        return dict(self.opt)

    def predict(self, *xs):
        return self.ref.evaluate(self.state, xs).output.astype(np.float32)


def test_a_tolerance_never_comes_from_a_run_on_the_other_side_of_a_kink():
    """Unpinned, the float32 runs' own side of the ReLU gives fc.weight a tolerance of 8x
    the whole gradient, and a C 3% off passes; pinned, the tolerance is float32 rounding
    and the same C fails (its step stays "near kink": no C tensors to replay here)."""

    torch.manual_seed(0)
    model = ReluNearZero()
    ref = Reference(model, ub.SGD(lr=1.0), "cross_entropy", [n for n, _ in
                                                             model.named_parameters()])
    data = [(torch.tensor([[W]]), torch.tensor([1]))]
    tolerance, wrong = _tolerances_unpinned_and_pinned(ref, data)
    assert tolerance[False] > 1 and tolerance[True] < 1e-4, tolerance


def test_a_near_kink_excuses_no_more_than_a_flip_of_it_moves():
    """Flipped, the ReLU's near-kink element moves fc's gradient (its first row: all or
    nothing) and never head's (ReLU's value is continuous at the kink). A C off in fc.weight
    within twice that stays "near kink"; off far beyond it, or off in head.weight at all,
    is a mismatch."""
    from ubitrain.fidelity.referee import FLIP_FACTOR, referee

    torch.manual_seed(0)
    model = ReluNearZero()
    ref = Reference(model, ub.SGD(lr=1.0), "cross_entropy", [n for n, _ in
                                                             model.named_parameters()])
    data = [(torch.tensor([[W]]), torch.tensor([1]))]
    small = referee(_Float64Trainer(ref, "fc.weight", 0.03), ref, data)
    assert small.status == "near kink", small.summary()
    effect = next(c.kink_effect for c in small.failures if c.name == "fc.weight")
    assert 0.03 < effect < 10, small.summary()
    large = referee(_Float64Trainer(ref, "fc.weight", 1.5 * FLIP_FACTOR * effect), ref, data)
    assert large.status == "mismatch", large.summary()
    head = referee(_Float64Trainer(ref, "head.weight", 0.03), ref, data)
    assert head.status == "mismatch", head.summary()
    assert next(c.kink_effect for c in head.failures if c.name == "head.weight") == 0


def test_a_flip_moves_a_near_tie_of_a_max_pool_to_the_runner_up():
    """What a kink flip can do (the bound of a near-kink excuse): the pool's gradient goes
    to the other element of the window."""
    x = torch.tensor([[[[1.0, 1.0 + 1e-12]]]], dtype=torch.float64)
    plain, _, _ = _steps(PoolNearTie, x, None)
    torch.manual_seed(0)
    model = PoolNearTie()
    ref = Reference(model, ub.SGD(lr=1.0), "cross_entropy", ["w", "head.weight", "head.bias"])
    state, batch = ref.initial_state(), (x, torch.tensor([1]))
    flip = SideReplay(flip=[np.array([[[[True]]]])])
    run = ref.step(state, {}, 1, batch, 0, torch.float64, recorder=flip)
    change = run.state["w"] - state["w"]
    assert plain["w"][..., 0] == 0 and plain["w"][..., 1] != 0
    assert change[..., 1] == 0 and change[..., 0] != 0 and not flip.unflipped


# ---- the other kink ops: leaky ReLU, ELU / SELU, hardsigmoid, hardswish, clamp, abs, --------
# ---- maximum / minimum, in-place forms (issue #39, fuzz seed 65) ---------------------------
F = nn.functional
E = 2.0 ** -30  # the input's offset: kept in float64, rounded away in float32
# name -> (the op on fc's output, its kink c, the side d of c float64's element sits on):
# fc's first output is c + d * E in float64 and c itself in float32, on another piece of the
# op's derivative; its second, 0.5, and third, -2, are far from every kink (the second passes
# a gradient; the op changes the third, so the C's copy of its input, where its side is read
# from that, is not taken for its output's).
KINK_OPS = {
    "leaky_relu": (lambda h: F.leaky_relu(h, 0.1), 0.0, 1),
    "leaky_relu_": (lambda h: F.leaky_relu(h, 0.1, inplace=True), 0.0, 1),
    "leaky_relu, negative slope": (lambda h: F.leaky_relu(h, -0.5), 0.0, 1),
    "elu": (lambda h: F.elu(h, 0.5), 0.0, 1),
    "elu_": (lambda h: F.elu(h, 0.5, inplace=True), 0.0, 1),
    "selu": (F.selu, 0.0, 1),
    "hardsigmoid": (F.hardsigmoid, -3.0, 1),
    "hardsigmoid_": (lambda h: F.hardsigmoid(h, inplace=True), 3.0, -1),
    "hardswish": (F.hardswish, -3.0, 1),
    "hardswish_": (lambda h: F.hardswish(h, inplace=True), 3.0, -1),
    "relu6_": (lambda h: F.relu6(h, inplace=True), 0.0, 1),
    "clamp": (lambda h: torch.clamp(h, -1.0, 1.0), -1.0, -1),
    "clamp_": (lambda h: torch.clamp_(h, -1.0, 1.0), 1.0, 1),
    "clamp_min": (lambda h: torch.clamp_min(h, 0.25), 0.25, -1),
    "abs": (torch.abs, 0.0, 1),
    "maximum": (lambda h: torch.maximum(h, torch.zeros_like(h)), 0.0, 1),
    "minimum": (lambda h: torch.minimum(h, torch.zeros_like(h)), 0.0, -1),
}
NO_C_SIDE = {"maximum", "minimum"}  # the C's side would need both inputs: not replayed


class KinkNet(nn.Module):
    def __init__(self, name):
        super().__init__()
        self.op, c, d = KINK_OPS[name]
        self.fc, self.head = nn.Linear(1, 3), nn.Linear(3, 2)
        with torch.no_grad():
            self.fc.weight.copy_(torch.tensor([[float(d)], [0.5], [-2.0]]))
            self.fc.bias.copy_(torch.tensor([c - d, 0.0, 0.0]))

    def forward(self, x):
        return self.head(self.op(self.fc(x)))


def _kink_reference(name):
    torch.manual_seed(0)  # the head's initial weights
    model = KinkNet(name)
    return Reference(model, ub.SGD(lr=1.0), "cross_entropy",
                     [n for n, _ in model.named_parameters()])


def _batch(offset):
    """fc's first output at c + d * offset (float64)."""
    return (torch.tensor([[1.0 + offset]], dtype=torch.float64), torch.tensor([1]))


def _off(a, b):
    """How far `a` is from `b`, relative to b's largest element (as the referee measures)."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("name", KINK_OPS)
def test_each_kink_rule_forces_the_branch_autograd_takes_there(name):
    """float32 puts fc's first output on the kink, another piece than float64's. Pinned to
    float64, its gradient is float64's; the C's side (float32's forward as the C tensors)
    replayed in float64 is float64 PyTorch's own gradient with the element on the kink; a flip
    is float64's own with the element mirrored across it."""
    ref = _kink_reference(name)
    state = ref.initial_state()

    def change(run):
        return np.concatenate([(run.state[k] - state[k]).ravel() for k in sorted(state)])

    def step(offset, dtype=torch.float64, recorder=None):
        return ref.step(state, {}, 1, _batch(offset), 0, dtype, record=True, recorder=recorder)

    exact, own = step(E), step(E, torch.float32)
    on_kink, mirrored = change(step(0.0)), change(step(-E))
    assert _off(change(own), change(exact)) > 1e-3  # float32's own piece
    pin = SideReplay(pin=exact.decisions)
    pinned = step(E, torch.float32, pin)
    assert pin.pinned >= 1 and not pin.unpinned, pin.unpinned
    assert _off(change(pinned), change(exact)) < 1e-6

    near = near_masks(exact.decisions, own.decisions)
    assert sum(int(m.sum()) for m in near if m is not None) == 1
    model = KinkNet(name).float()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    h = model.fc(torch.ones(1, 1))
    c_tensors = [t.detach().double().numpy().ravel() for t in (h, model.op(h.clone()))]
    replay = SideReplay(c_tensors, near)
    replayed = step(E, recorder=replay)
    if name in NO_C_SIDE:
        assert replay.replayed == 0 and replay.unreplayed
    else:
        assert replay.replayed == 1 and not replay.unreplayed, replay.unreplayed
        assert _off(change(replayed), on_kink) < 1e-8
    flip = SideReplay(flip=near)
    assert _off(change(step(E, recorder=flip)), mirrored) < 1e-8
    assert not flip.unflipped


@pytest.mark.parametrize("name", KINK_OPS)
def test_a_tolerance_near_each_kink_is_rounding_and_its_excuse_is_bounded(name):
    """As for ReLU above: unpinned, float32's own piece gives fc.weight a tolerance a C 3% off
    passes; pinned, the tolerance is rounding and that C is not a match. Its step stays "near
    kink" (no C tensors here), excused only as far as a flip moves fc.weight: a C off by
    3 times that is a mismatch."""
    from ubitrain.fidelity.referee import FLIP_FACTOR, referee

    ref = _kink_reference(name)
    data = [_batch(E)]
    tolerance, wrong = _tolerances_unpinned_and_pinned(ref, data)
    assert tolerance[False] > 0.03 and tolerance[True] < 1e-4, tolerance
    assert wrong.status == "near kink" and not wrong.unpinned, wrong.summary()
    effect = next(c.kink_effect for c in wrong.failures if c.name == "fc.weight")
    assert 0.03 < effect < 10, wrong.summary()
    large = referee(_Float64Trainer(ref, "fc.weight", 1.5 * FLIP_FACTOR * effect), ref, data)
    assert large.status == "mismatch", large.summary()


def _tolerances_unpinned_and_pinned(ref, data):
    """fc.weight's tolerance unpinned and pinned ({pin: tolerance}), each for a C that is
    right (a match) and one 3% off there (a match only unpinned); the pinned verdict on
    the wrong one."""
    from ubitrain.fidelity.referee import referee

    tolerance = {}
    for pin in (False, True):
        right = referee(_Float64Trainer(ref), ref, data, pin=pin)
        assert right.status == "match", right.summary()
        tolerance[pin] = next(c.tolerance for c in right.checks if c.name == "fc.weight")
        wrong = referee(_Float64Trainer(ref, "fc.weight", 0.03), ref, data, pin=pin)
        assert (wrong.status == "match") == (not pin), wrong.summary()
    return tolerance, wrong


def test_a_c_tensor_is_found_by_value_only_when_no_other_comes_near():
    """sides._match: the C's copy of an op's tensor is the one within 1e-3 of its largest
    value, or, where rounding is amplified (a BatchNorm over a few nearly equal values), the
    one within 5e-2 with every other tensor of its size ten times further; two candidates
    that close, and none is taken (a wrong tensor's sides would be replayed)."""
    from ubitrain.fidelity.sides import _match

    t = torch.linspace(-1.0, 1.0, 64, dtype=torch.float64)
    exact, noisy, other = t.numpy(), t.numpy() + 2e-3, -t.numpy()
    assert _match([other, exact], t) == 1
    assert _match([other, noisy], t) == 1  # 2e-3: a unique candidate
    assert _match([noisy, t.numpy() + 1.5e-2], t) is None  # the runner-up is 7.5x, not 10x
    assert _match([other, t.numpy() + 0.1], t) is None  # beyond 5e-2
    assert _match([np.zeros(63)], t) is None  # no tensor of its size
