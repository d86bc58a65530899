"""The referee can fail: a small model built with deliberately wrong C (tools/mutants/), one
plausible defect at a time, is told apart from PyTorch, and the C as generated is not. The
whole suite over the real models: benchmarks/mutants.py."""

import numpy as np
import torch
from torch import nn

import ubitrain as ub
from tools.mutants import BASELINE, judge_mutants, mutant


class Residual(nn.Module):
    """conv-BN-ReLU6, a depthwise residual block with BN and ReLU, max pooling, a linear head:
    a fan-out, both kink kinds, BatchNorm."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                  nn.ReLU6(inplace=True))
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8),
                                   nn.ReLU(inplace=True), nn.Conv2d(8, 8, 1))
        self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.fc(self.pool(x).flatten(1))


def test_mutants_of_a_small_model_are_caught(tmp_path):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))]
    names = ["drop_sum_term", "kink_le", "no_weight_decay"]
    results = judge_mutants([BASELINE] + [mutant(n) for n in names], Residual(), data,
                            ub.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4), tmp_path)
    base, *mutants = results
    assert base.status == "match", base.summary
    for r in mutants:
        assert r.exercised, f"{r.mutant}: {r.where}"
        assert r.caught, f"{r.mutant} ({r.where}) not caught: {r.summary}"


class NormNearKink(nn.Module):
    """BatchNorm over a channel of small variance (eps matters: 1e-4 for 1e-5 moves its
    output by 0.3%), then ReLU, with two elements 2**-22 either side of the channel mean:
    near ReLU's kink, so the step is undecided until the C's side is known. The running
    variance is large, so that in predict eps is lost in rounding: the train step alone
    can tell the defect."""

    def __init__(self):
        super().__init__()
        self.norm, self.fc = nn.BatchNorm2d(1), nn.Linear(4, 10)
        self.norm.running_var.fill_(100.0)

    def forward(self, x):
        return self.fc(torch.relu(self.norm(x)).flatten(1))


def _near_kink_batch():
    # 16 values symmetric about 1.5 (their mean, exactly), spread 0.1: two of them 1.5 ± 2**-22
    offsets = [(2 * j + 1) / 64 for j in range(7)] + [2 ** -22]
    x = torch.tensor([1.5 + s * o for o in offsets for s in (1, -1)]).reshape(4, 1, 2, 2)
    return x, torch.tensor([1, 3, 5, 7])


def test_a_wrong_forward_is_not_excused_by_a_kink(tmp_path):
    """BatchNorm's eps off (1e-4 for 1e-5) moves the C's ReLU output by more than the replay's
    look-up allows, so its near-kink elements cannot be replayed. The step was left "near
    kink" and the mutant escaped (ds_cnn_kws, issue #39): a kink flip moves no forward value
    (the loss, the running statistics) and moves a gradient only so far."""
    from ubitrain.fidelity.kinks import near_kinks
    from ubitrain.fidelity.reference import Reference

    torch.manual_seed(0)
    model, data = NormNearKink(), [_near_kink_batch()]
    optimizer = ub.SGD(lr=0.1)
    reference = Reference(model, optimizer, "cross_entropy", ["norm.weight", "norm.bias",
                                                               "fc.weight", "fc.bias"])
    state = reference.initial_state()
    exact = reference.step(state, {}, 1, data[0], 0, torch.float64, record=True)
    rounded = reference.step(state, {}, 1, data[0], 0, torch.float32, record=True)
    assert near_kinks(exact.decisions, rounded.decisions)  # the step is near a kink
    base, eps = judge_mutants([BASELINE, mutant("bn_eps")], model, data, optimizer, tmp_path)
    assert base.status == "match", base.summary
    assert eps.exercised and eps.caught, f"bn_eps ({eps.where}): {eps.status}: {eps.summary}"


def test_int8_mutants_are_caught_bit_for_bit(tmp_path):
    """The int8 step's C (pipeline/int8.py) with a defect NITI's arithmetic makes easy:
    negative halves rounded toward zero, a residual's backward sum dropping a term, the ReLU
    mask's < as <=, the update's mu off by one; each differs from the numpy reference. The
    whole int8 suite, on every int8 test model and a cross target: benchmarks/mutants.py
    --precision int8."""
    from tools.int8_models import MODELS, int8_batches
    from tools.mutants import INT8_MUTANTS, judge_int8_mutants

    torch.manual_seed(0)
    config = ub.NITI(mu=(5, 4), milestones=(2,), max_interval=4)
    names = ["round_half", "drop_sum_term", "relu_le", "mu_off_by_one"]
    base, *mutants = judge_int8_mutants(
        [BASELINE] + [mutant(n, INT8_MUTANTS) for n in names], MODELS[2](), int8_batches(2),
        config, tmp_path)
    assert base.status == "match", base.summary
    for r in mutants:
        assert r.exercised and r.caught, f"{r.mutant} ({r.where}): {r.status}: {r.summary}"


def test_a_shared_first_step_run_is_the_run_it_replaces():
    """tools/mutants/reuse.py: PyTorch's runs of step 1 are computed once per model and
    handed to every mutant; a run looked up (float64, and float32 pinned to its branches)
    gives what running it again gives, its recorder's outcome included."""
    from tools.mutants.reuse import SharedReference
    from ubitrain.fidelity.reference import FLOAT32_VARIANTS, Reference
    from ubitrain.fidelity.sides import SideReplay

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen))
    model, optimizer = Residual(), ub.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4)
    names = [n for n, _ in model.named_parameters()]
    shared, fresh = (cls(model, optimizer, "cross_entropy", names)
                     for cls in (SharedReference, Reference))
    state = fresh.initial_state()
    for _ in range(2):
        exact = shared.step(state, {}, 1, batch, 0, torch.float64, record=True)
        recorder = SideReplay(pin=exact.decisions)
        run = shared.step(state, {}, 1, batch, 0, torch.float32, FLOAT32_VARIANTS[2],
                          recorder=recorder)
    assert shared.hits == 2
    want = fresh.step(state, {}, 1, batch, 0, torch.float64, record=True)
    again = SideReplay(pin=want.decisions)
    want_run = fresh.step(state, {}, 1, batch, 0, torch.float32, FLOAT32_VARIANTS[2],
                          recorder=again)
    for got, expected in ((exact, want), (run, want_run)):
        assert got.loss == expected.loss
        for part in ("state", "opt_state"):
            a, b = getattr(got, part), getattr(expected, part)
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert recorder.unpinned == again.unpinned and recorder.pinned == again.pinned
    assert recorder.decisions.ops == again.decisions.ops


def test_a_mutant_within_float32s_own_error_is_told_apart_from_a_miss():
    """tools/mutants/run.py effect: a C no further from float64 than float32 PyTorch on any
    check (error / spread at most 1; a check within its rounding floor counts 0), or than the
    C as generated where that is further, is one no referee comparing with float32 could
    call wrong; otherwise the ratio says by how much, and where: within the 8x headroom, or
    a hole."""
    from tools.mutants.run import effect
    from ubitrain.fidelity.referee import SPREAD_FACTOR, Check, Verdict

    def check(error, spread, floor=1e-7, name="w"):
        return Check(1, name, error, spread, SPREAD_FACTOR * spread + floor)

    assert effect(Verdict("match", [check(1e-3, 2e-3), check(5e-8, 0.0, name="b")])) == (
        0.5, "step 1 w")  # b within its rounding floor
    assert effect(Verdict("match", [check(1e-3, 2e-3), check(6e-3, 2e-3, name="b")])) == (
        3.0, "step 1 b")  # within the headroom: a miss by design
    assert effect(Verdict("match", [check(2e-7, 0.0)]))[0] == float("inf")
    # measured beyond the C as generated where it is itself further than float32
    base = Verdict("match", [check(1e-3, 2e-3), check(5e-3, 2e-3, name="b")])
    assert effect(Verdict("match", [check(1e-3, 2e-3), check(6e-3, 2e-3, name="b")]),
                  base) == (1.2, "step 1 b")
    assert effect(Verdict("match", [check(3e-3, 2e-3), check(4e-3, 2e-3, name="b")]),
                  base) == (1.5, "step 1 w")
