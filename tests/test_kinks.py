"""The referee's kink finder (fidelity/kinks.py) on elements placed at known distances from
a kink: it must report an element within float32 rounding of one, in-place ops included
(measured before they overwrite their input), and not exact ties or elements far away."""

import pytest
import torch
import torch.nn.functional as F

from ubitrain.fidelity.kinks import DecisionRecorder, near_kinks


def _near(op, values):
    """near_kinks for `op` applied to `values` in float64 against float32."""
    runs = []
    for dtype in (torch.float64, torch.float32):
        with DecisionRecorder() as rec:
            op(torch.tensor(values, dtype=dtype))
        runs.append(rec.decisions)
    return near_kinks(*runs)


FAR = [0.5, -0.75, 3.0, 0.1]


@pytest.mark.parametrize("op, name, kink", [
    (F.relu, "relu.default", 0.0),
    (lambda t: F.relu(t, inplace=True), "relu_.default", 0.0),
    (F.relu6, "hardtanh.default", 6.0),
    (lambda t: F.relu6(t, inplace=True), "hardtanh_.default", 6.0),
    (lambda t: F.hardtanh(t, inplace=True), "hardtanh_.default", -1.0),
    (lambda t: t.clamp_(min=-2.0, max=2.0), "clamp_.default", 2.0),
    (lambda t: F.leaky_relu(t, 0.1, inplace=True), "leaky_relu_.default", 0.0),
    (F.leaky_relu, "leaky_relu.default", 0.0),
    (F.hardsigmoid, "hardsigmoid.default", 3.0),
    (lambda t: F.hardsigmoid(t, inplace=True), "hardsigmoid_.default", -3.0),
    (lambda t: F.elu(t, 0.5), "elu.default", 0.0),
    (lambda t: F.elu(t, 2.0, inplace=True), "elu_.default", 0.0),
])
def test_an_element_within_rounding_of_a_kink_is_found(op, name, kink):
    # just past the kink, on its clamped side: an in-place op measured after it ran would
    # see the bound itself, an exact tie
    past = kink + 1e-9 if kink > 0 else kink - 1e-9
    found = _near(op, FAR + [past])
    assert found == [f"aten.{name}: 1 of 5 elements"], found
    assert _near(op, FAR) == []


def test_exact_ties_are_not_near():
    assert _near(F.relu, FAR + [0.0, 0.0]) == []


def test_the_default_elu_has_no_kink():
    """With alpha = 1 ELU's slope is 1 on both sides of 0: nothing to be near."""
    assert _near(F.elu, FAR + [1e-9, -1e-9]) == []


def test_an_in_place_relu6_inside_a_model_is_recorded():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU6(inplace=True))
    with DecisionRecorder() as rec:
        net(torch.randn(2, 3))
    assert rec.decisions.ops == ["aten.hardtanh_.default"]
