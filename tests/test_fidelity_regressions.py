"""Models that ubitrain once trained silently wrong, each judged against PyTorch in float64
step by step (ubitrain.fidelity.referee: tolerance from PyTorch's own float32 spread, the
arena poisoned with NaN so that a read of unwritten memory shows)."""

import pytest
import torch
import torch.nn.functional as F
from op_harness import assert_match, batches
from torch import nn

import ubitrain as ub
from tools.fuzzing.case import seeded_batches
from tools.fuzzing.graphs import vary_norm_parameters
from ubitrain.fidelity.referee import judge, kinks_along
from ubitrain.fidelity.reference import Reference


class ReluAvgPool(nn.Module):
    """avg_pool2d with stride >= kernel after a nonlinear op: the fused, in-place gradient
    kernel (pool gradient, then ReLU mask) computed its one-tap reduction before zeroing it
    (the printer hoisted a reduction's update above its init)."""

    def __init__(self, k, s, p, ceil):
        super().__init__()
        self.c, self.pool = nn.Conv2d(3, 8, 3, 1, 1), (k, s, p, ceil)
        with torch.no_grad():
            size = F.avg_pool2d(torch.zeros(1, 8, 16, 16), k, s, p, ceil).numel()
        self.fc = nn.Linear(size, 10)

    def forward(self, x):
        k, s, p, ceil = self.pool
        return self.fc(F.avg_pool2d(torch.tanh(self.c(x)), k, s, p, ceil).flatten(1))


@pytest.mark.parametrize("pool", [(2, 2, 0, False), (3, 3, 0, False), (2, 2, 1, False),
                                  (1, 2, 0, True), (2, 3, 0, False)])
def test_average_pool_after_activation(pool, tmp_path):
    torch.manual_seed(0)
    assert_match(judge(ReluAvgPool(*pool), batches((4, 3, 16, 16), 10),
                       ub.SGD(lr=0.05, momentum=0.9), tmp_path))


class SumOfSum(nn.Module):
    """A reduction over a size-1 dim combined with its own input: `u - s` is 0, but the
    fused forward kernel read its accumulator before zeroing it."""

    def __init__(self):
        super().__init__()
        self.c, self.fc = nn.Conv2d(3, 4, 3, 1, 1), nn.Linear(4, 2)

    def forward(self, x):
        s = self.c(x).sum((2, 3), keepdim=True)
        return self.fc((s.sum(2, keepdim=True) - s + s.mean(2, keepdim=True)).flatten(1))


def test_reduction_over_a_size_one_dim(tmp_path):
    torch.manual_seed(0)
    assert_match(judge(SumOfSum(), batches((2, 3, 5, 5), 2), ub.SGD(lr=0.05, momentum=0.9),
                       tmp_path))


class OneChannelNorm(nn.Module):
    """BatchNorm2d(1): its parameters have one element, and the in-place optimizer update
    of a one-element tensor (no loop around the stores) wrote the new weight before the
    moments read the old one for the weight decay."""

    def __init__(self):
        super().__init__()
        self.bn, self.fc = nn.BatchNorm2d(1), nn.Linear(36, 3)

    def forward(self, x):
        b = self.bn(x)
        return self.fc(((b * x) * b).flatten(1))


@pytest.mark.parametrize("optimizer", [ub.Adam(lr=1e-2, weight_decay=1e-2),
                                       ub.SGD(lr=0.05, momentum=0.9, weight_decay=1e-2),
                                       ub.AdamW(lr=1e-2)], ids=["adam", "sgd", "adamw"])
def test_one_element_parameters_with_weight_decay(optimizer, tmp_path):
    torch.manual_seed(0)
    assert_match(judge(OneChannelNorm(), batches((4, 1, 6, 6), 3), optimizer, tmp_path))


class UnusedLayers(nn.Module):
    """A registered BatchNorm and Linear that forward never calls: PyTorch keeps their state
    and its optimizers skip them (no gradient: no weight decay, no momentum)."""

    def __init__(self):
        super().__init__()
        self.bn, self.unused_bn, self.unused_fc = nn.BatchNorm2d(3), nn.BatchNorm2d(4), \
            nn.Linear(4, 4)
        self.fc = nn.Linear(48, 3)

    def forward(self, x):
        return self.fc(self.bn(x).flatten(1))


def test_unused_layers_keep_their_state(tmp_path):
    torch.manual_seed(0)
    model = UnusedLayers()
    verdict = judge(model, batches((2, 3, 4, 4), 3), ub.SGD(lr=0.1, momentum=0.9,
                                                           weight_decay=0.1), tmp_path)
    assert_match(verdict)
    state = verdict.trajectory[-1][1]
    for name, value in model.state_dict().items():
        if name.startswith("unused"):
            assert (state[name] == value.numpy()).all(), name


class InPlaceOnInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(48, 3)

    def forward(self, x):
        return self.fc(F.relu(x, inplace=True).flatten(1))


def test_in_place_activation_on_the_model_input(tmp_path):
    torch.manual_seed(0)
    assert_match(judge(InPlaceOnInput(), batches((2, 3, 4, 4), 3), ub.SGD(lr=0.1), tmp_path))


def test_parameters_that_do_not_require_grad_stay_frozen(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    model[0].requires_grad_(False)
    verdict = judge(model, batches((4, 6), 3), ub.SGD(lr=0.1, weight_decay=0.1), tmp_path)
    assert_match(verdict)
    state = verdict.trajectory[-1][1]
    assert (state["0.weight"] == model[0].weight.detach().numpy()).all()
    assert (state["0.bias"] == model[0].bias.detach().numpy()).all()


class ConcatChain(nn.Module):
    """Three concatenations fused into one kernel: every `c ? a[i - k] : a[i]` there is two
    conditional loads, which GCC 12's loop vectorizer (-O3, AVX2) reads at a wrong offset
    (UB_NO_LOOP_VECTORIZE, runtime_c/ub_runtime.h)."""

    def __init__(self):
        super().__init__()
        self.conv, self.head = nn.Conv2d(2, 2, 1, bias=False), nn.Linear(48, 2)

    def forward(self, x):
        t = self.conv(x)
        t = torch.cat([t, t], 3)
        t = torch.cat([t, t], 2)
        return self.head(torch.cat([t, t], 2).flatten(1))


def test_concatenations_fused_into_one_kernel(tmp_path):
    torch.manual_seed(0)
    assert_match(judge(ConcatChain(), batches((1, 2, 3, 1), 2, steps=2),
                       ub.SGD(lr=0.1, momentum=0.9), tmp_path))


class NormThenPermute(nn.Module):
    """BatchNorm's output permuted, with a size-1 dim: ubitrain was right, PyTorch 2.13's CPU
    BatchNorm backward is wrong on such a permuted gradient (the referee now makes backward
    inputs contiguous, fidelity/reference.py)."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(2, 4, 1, bias=False), nn.BatchNorm2d(4), \
            nn.Linear(12, 8)

    def forward(self, x):
        return self.head(self.bn(self.conv(x)).permute(0, 3, 2, 1).flatten(1))


def test_batch_norm_output_permuted(tmp_path):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(2, 2, 1, 3, generator=gen), torch.randn(2, 8, generator=gen))]
    assert_match(judge(NormThenPermute(), data, ub.SGD(lr=0.1, momentum=0.9), tmp_path,
                       loss="mse"))


class PaddingOnlyColumn(nn.Module):
    """A 1x1 conv with padding 1 and stride 3 over a width of 1: its one output column reads
    padding only, so the weight gradient gets nothing from it; the gradient rule sliced the
    input to width 0 and Relax's Gradient pass failed (fuzz seeds 1274, 1313)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 12, 1, stride=3, padding=1, dilation=2, groups=4)
        self.head = nn.Linear(24, 5)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


def test_conv_whose_taps_read_padding_only(tmp_path):
    torch.manual_seed(0)
    assert_match(judge(PaddingOnlyColumn(), batches((2, 4, 3, 1), 5),
                       ub.SGD(lr=0.1, momentum=0.9), tmp_path))


class WideBiasSum(nn.Module):
    """A Linear over a 4D tensor: its bias gradient sums 1152 rows, which the broadcast's
    gradient (collapse_sum) accumulated in float32, 25x further from float64 than PyTorch
    (fuzz seed 1189); it accumulates in the target's wide type now, as sums do."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(3, 4), nn.Linear(1, 7)

    def forward(self, x):
        t = torch.sigmoid(x.reshape(x.shape[0], 72, 1, 3))
        return self.head(self.fc(t).mean((1, 2, 3), keepdim=True).flatten(1))


def test_bias_gradient_over_many_rows(tmp_path):
    torch.manual_seed(0)
    assert_match(judge(WideBiasSum(), batches((16, 4, 9, 6), 7),
                       ub.SGD(lr=0.01, momentum=0.9), tmp_path))


class CancelledBias(nn.Module):
    """Fuzz seed 20072: BatchNorm (and a softmax over one element) make the gradient of
    linear.bias exactly 0, so what every float32 run computes for it is rounding noise.
    Adam's second moment squares that noise: judged as it is, the C's noise (3x float32
    PyTorch's on the gradient) failed as 10x on exp_avg_sq."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(21, 1)
        self.bn = nn.BatchNorm1d(1, eps=1e-3)
        self.head = nn.Linear(2, 6)

    def forward(self, x):
        t = self.linear(F.elu(x, -0.7))
        return self.head(torch.cat([self.bn(t), F.softmax(t, dim=-1)], 1))


def test_a_gradient_that_is_rounding_noise_under_adam(tmp_path):
    torch.manual_seed(20072)  # the fuzzer's model and data for that seed
    model = CancelledBias()
    vary_norm_parameters(model, 20072)
    data = seeded_batches(20072, 0, (4, 21), 1, "cross_entropy", 6)
    verdict = judge(model, data, ub.Adam(lr=0.01), tmp_path)
    assert_match(verdict)
    bias = [c for c in verdict.checks if c.name == "linear.bias.exp_avg_sq"]
    assert bias and bias[0].spread > 0  # judged, against float32 PyTorch's own noise


class LongDotProduct(nn.Module):
    """Fuzz seed 21134: a Linear(620, 2) at batch 1 with the micro-kernels off. The scheduled
    TIR summed each output's 620 products in one float32 chain (only reductions of a multiple
    of 8 got partial sums), 26x float32 PyTorch's rounding; it now sums in 8 partial sums,
    the last chunk predicated."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(4, 12)
        self.head = nn.Linear(620, 2)

    def forward(self, x):
        t2 = F.max_pool2d(x, 2, stride=1, padding=1)
        return self.head(torch.cat([self.linear1(x).flatten(1), t2.flatten(1)], 1))


def test_a_long_dot_product_without_micro_kernels(tmp_path):
    torch.manual_seed(21134)  # the fuzzer's (reduced) model and data for that seed
    model = LongDotProduct()
    vary_norm_parameters(model, 21134)
    data = seeded_batches(21134, 0, (1, 5, 7, 4), 3, "mse", 2)
    assert_match(judge(model, data, ub.SGD(lr=0.1, momentum=0.9), tmp_path, loss="mse",
                       seed=21134, disable_passes=("microkernels",)))


class DeadRelu(nn.Module):
    """Every unit of `linear` is dead (a ReLU below zero for every sample): its gradient is
    exactly 0, and so is Adam's second moment. The referee's one-ulp float32 variant nudged
    that 0 below zero, its square root was NaN, and the tolerance of every such check became
    infinite: a check that could not fail."""

    def __init__(self):
        super().__init__()
        self.linear, self.head = nn.Linear(6, 4), nn.Linear(10, 3)
        with torch.no_grad():
            self.linear.bias.fill_(-100.0)

    def forward(self, x):
        return self.head(torch.cat([F.relu(self.linear(x)), x], 1))


def test_checks_of_a_dead_layer_under_adam_can_fail(tmp_path):
    import math

    torch.manual_seed(0)
    verdict = judge(DeadRelu(), batches((4, 6), 3), ub.Adam(lr=0.01), tmp_path)
    assert_match(verdict)
    dead = [c for c in verdict.checks if c.name.startswith("linear.")]
    assert dead and all(math.isfinite(c.tolerance) for c in verdict.checks), \
        [str(c) for c in verdict.checks if not math.isfinite(c.tolerance)]


class ChainedGramProducts(nn.Module):
    """Fuzz seed 2004, reduced: three chained `xᵀ @ linear(x)` products. One SGD step takes
    the float64 prediction to 1e50, beyond float32's range: PyTorch's float32 gives inf as the
    C does. Judged a mismatch (error inf against a tolerance from float32 runs that were all
    inf); float32 cannot train this model, so the referee says it diverges."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1, bias=False)
        self.c, self.head = nn.Linear(1, 1), nn.Linear(1, 2)

    def forward(self, x):
        t1 = x.transpose(-1, -2) @ self.a(x)
        t2 = t1 @ t1.transpose(-1, -2)
        t3 = t2.transpose(-1, -2) @ self.b(t2)
        t4 = t3.transpose(-1, -2) @ self.c(t3)
        return self.head(t4.reshape(t4.shape[0], -1))


def test_a_model_beyond_float32_range_diverges(tmp_path):
    torch.manual_seed(2004)
    model = ChainedGramProducts()
    verdict = judge(model, seeded_batches(2004, 0, (1, 1, 4, 4), 1, "mse", 2),
                    ub.SGD(lr=0.1, momentum=0.9), tmp_path, loss="mse")
    assert verdict.status == "diverges", verdict.summary()


class ScaleBeforeBatchNorm(nn.Module):
    """Fuzz seed 71 (the CI tier after the op table grew): batch_norm2 normalises away
    batch_norm1's scale, so batch_norm1.weight's gradient is cancellation, zero but for eps.
    The C (its Linear layers summed in another order) was 10x the spread of PyTorch's three
    float32 runs at step 2 under AdamW, yet the median of 40 noisy float32 runs: the spread
    is measured again on 16 more runs before a step is called a mismatch."""

    def __init__(self):
        super().__init__()
        self.batch_norm1, self.batch_norm2 = nn.BatchNorm1d(1), nn.BatchNorm1d(1)
        self.dropout_inplace4 = nn.Linear(1, 1)
        self.dropout_inplace6 = nn.Sequential(nn.Linear(1, 4), nn.Dropout(0.1, inplace=True))
        self.layer_norm7 = nn.LayerNorm([4], elementwise_affine=False)
        self.linear12, self.head = nn.Linear(1, 8), nn.Linear(13, 5)

    def forward(self, x):  # the fuzzer's op order: its float32 runs nudge results in order
        t3 = self.batch_norm2(self.batch_norm1(x))
        t3 = t3 * torch.bernoulli(torch.zeros_like(t3), 0.8) if self.training else t3
        t4 = F.dropout(self.dropout_inplace4(t3), 0.1, training=self.training, inplace=True)
        t5 = t4 * torch.bernoulli(torch.zeros_like(t4), 0.8) if self.training else t4
        t7 = self.layer_norm7(self.dropout_inplace6(t5))
        t8 = t7 * torch.empty_like(t7).bernoulli_(0.8) if self.training else t7
        t10 = F.hardswish(F.softmax(t8, dim=-2))
        t12 = self.linear12(F.elu(t4, 0.5))
        t13 = F.hardsigmoid(t3)
        t14 = F.log_softmax(t10, dim=0)
        return self.head(torch.cat([t12, t13, t14], 1))


def test_a_gradient_of_pure_cancellation_is_judged_on_more_runs(tmp_path):
    torch.manual_seed(71)
    model = ScaleBeforeBatchNorm()
    vary_norm_parameters(model, 71)
    data = seeded_batches(71, 0, (4, 1), 2, "cross_entropy", 5)
    assert_match(judge(model, data, ub.AdamW(lr=0.01, weight_decay=0.01), tmp_path, seed=71))


class PaddedMaxPool1d(nn.Module):
    """Fuzz seed 50298 (the a60789d campaign), reduced: with the micro-kernels off, the printed
    max-pool gradient read its window's gradient at index -1 where it is 0 (TVM's
    FlattenBuffer rewrote floordiv(1 - gj, 3) as gj // -3): LayerNorm's bias went to inf."""

    def __init__(self, width, pool):
        super().__init__()
        self.fc, self.pool = nn.Linear(3, width), pool
        with torch.no_grad():
            size = F.max_pool1d(torch.zeros(1, 1, width), *pool).numel()
        self.head = nn.Linear(size, 2)

    def forward(self, x):
        return self.head(F.max_pool1d(self.fc(x).unsqueeze(1), *self.pool).flatten(1))


@pytest.mark.parametrize("width, pool", [(1, (3, 3, 1)), (2, (3, 3, 1)), (5, (3, 3, 1)),
                                         (4, (2, 2, 1)), (7, (3, 2, 1))])
def test_padded_max_pool_gradient_without_micro_kernels(width, pool, tmp_path):
    torch.manual_seed(0)
    assert_match(judge(PaddedMaxPool1d(width, pool), batches((4, 3), 2, seed=50298),
                       ub.SGD(lr=0.1, momentum=0.9), tmp_path,
                       disable_passes=("microkernels",)))


class PoolToTallerOutput(nn.Module):
    """Fuzz seed 60367 (the b84f55f campaign), reduced: adaptive max pool of a height-1 input
    to height 2. GCC 12's vectoriser, on an AVX2 host, made masked loads of the gradient's
    `argmax == w ? dy : 0` with the wrong address: channel 1 read channel 0's second row of dy,
    and the conv's gradients were 120-180% off (CMakeLists.txt.j2: -fno-tree-loop-if-convert)."""

    def __init__(self, height):
        super().__init__()
        self.c, self.height = nn.Conv2d(1, 2, 1), height
        self.head = nn.Linear(2 * height * 6, 2)

    def forward(self, x):
        return self.head(F.adaptive_max_pool2d(self.c(x), (self.height, None)).flatten(1))


@pytest.mark.parametrize("height", [2, 3])
def test_adaptive_max_pool_to_a_taller_output(height, tmp_path):
    torch.manual_seed(0)
    assert_match(judge(PoolToTallerOutput(height), batches((1, 1, 1, 6), 2, seed=60367),
                       ub.SGD(lr=0.1, momentum=0.9), tmp_path))


class DroppedFeatures(nn.Module):
    """Fuzz seed 73559: in-place Dropout zeroes some of the head's inputs, so under Adam some of
    head.weight's gradients, and second moments, are exactly 0. The referee's noisy float32 runs
    nudged those zeros below zero, took NaN square roots and were set aside whole, so the spread
    of head.weight came from the one plain run: the C's 3.9e-5 was judged against 1.0e-5,
    where the noisy runs, at the element it was, spread as far (they now leave zeros as they
    are)."""

    def __init__(self):
        super().__init__()
        self.linear2 = nn.Linear(7, 5)
        self.dropout_inplace4 = nn.Sequential(nn.Linear(2, 11), nn.Dropout(0.5, inplace=True))
        self.head = nn.Linear(136, 4)

    def forward(self, x):
        t2 = self.linear2(F.hardsigmoid(x))
        t4 = self.dropout_inplace4(F.avg_pool2d(t2, 1, stride=3))
        return self.head(torch.cat([t4.flatten(1), F.silu(t2).flatten(1)], 1))


def test_zero_gradients_under_adam_keep_the_noisy_runs(tmp_path):
    import math

    torch.manual_seed(73559)  # the fuzzer's model and data for that seed
    model = DroppedFeatures()
    vary_norm_parameters(model, 73559)
    data = seeded_batches(73559, 0, (3, 2, 7, 7), 2, "cross_entropy", 4)
    verdict = judge(model, data, ub.Adam(lr=0.01), tmp_path, seed=73559)
    assert_match(verdict)
    head = [c for c in verdict.checks if c.name == "head.weight"]
    assert head and all(math.isfinite(c.spread) and c.spread > 0 for c in head)


def test_runs_whose_prediction_pytorch_cannot_compute_are_compared_step_by_step():
    """Fuzz seeds 71872 and 72252: PyTorch's own prediction overflowed after the steps, so the
    verdicts ("diverges") held no prediction; comparing the two runs bit for bit took a step
    for it and failed inside numpy."""
    import numpy as np

    from tools.fuzzing.case import first_difference
    from ubitrain.fidelity.referee import Verdict

    def verdict(w, prediction=None):
        state = {"w": np.array([w], np.float32)}
        return Verdict("diverges", trajectory=[(np.float32(1.0), state, {})],
                       prediction=prediction)

    assert first_difference(verdict(0.5), verdict(0.5)) is None
    assert first_difference(verdict(0.5), verdict(0.25)) == "w after step 1"
    out = np.zeros((2, 3), np.float32)
    assert first_difference(verdict(0.5, out), verdict(0.5, out + 1)) == "predict's output"


class ConstantsAcrossOps(nn.Module):
    """Fuzz seeds 72003 and 72819: fused into one kernel, `1.5 - (y + 1.5)` and
    `0.5 - hardsigmoid(y)` were simplified by TVM as if floats were reals, to `0 - y` and
    `0 - clip(y) / 6`: other bits than the same ops unfused, and than PyTorch (where
    y + 1.5 rounds). Each op's float result is now kept as written (kernels/float_barrier.py).
    y is small next to 1.5, so that its rounding there shows."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(6, 5)
        self.head = nn.Linear(10, 3)

    def forward(self, x):
        y = self.linear(x) * 1e-3
        return self.head(torch.cat([F.elu(1.5 - (y + 1.5)), 0.5 - F.hardsigmoid(y)], 1))


def test_fused_float_arithmetic_is_the_unfused_arithmetic(tmp_path):
    from tools.fuzzing.case import first_difference

    torch.manual_seed(0)
    model, data = ConstantsAcrossOps(), batches((4, 6), 2)
    fused = judge(model, data, ub.SGD(lr=0.1, momentum=0.9), tmp_path / "fused")
    unfused = judge(model, data, ub.SGD(lr=0.1, momentum=0.9), tmp_path / "unfused",
                    disable_passes=("fuse_kernels",))
    assert_match(fused)
    assert first_difference(fused, unfused) is None


class CellStateOfOneStep(nn.Module):
    """Fuzz seed 82380: over a one-step sequence an LSTM's cell state does not depend on its
    projection, so `weight_hr_l0` gets no gradient and PyTorch's optimizers keep no state
    for it; the referee looked that state up and failed before any C was built."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 5, proj_size=1, batch_first=True)
        self.head = nn.Linear(5, 3)

    def forward(self, x):
        return self.head(self.lstm(x)[1][1].transpose(0, 1).flatten(1))


@pytest.mark.parametrize("optimizer", [ub.Adam(lr=1e-2), ub.AdamW(lr=1e-2, weight_decay=0.1),
                                       ub.SGD(lr=0.1, momentum=0.9, weight_decay=0.1)])
def test_a_parameter_without_gradient_has_no_optimizer_state(optimizer, tmp_path):
    torch.manual_seed(0)
    model = CellStateOfOneStep()
    data = batches((2, 1, 8), 3)
    names = [n for n, _ in model.named_parameters()]
    kinks_along(Reference(model, optimizer, "cross_entropy", names), data)  # the fuzzer's probe
    verdict = judge(model, data, optimizer, tmp_path)
    assert_match(verdict)
    # the projection stays as it was (no weight decay either), and holds no state
    start = model.state_dict()["lstm.weight_hr_l0"].numpy()
    for _, state, opt_state in verdict.trajectory:
        assert (state["lstm.weight_hr_l0"] == start).all()
        assert not any(k.startswith("lstm.weight_hr_l0.") for k in opt_state)


class VanishingSoftmaxWeight(nn.Module):
    """Fuzz seed 90663: a gradient that flows only through a softmax weight of e^-120 (there,
    an attention's). The C's exp stopped at FLT_MIN (1e-38) instead of underflowing to 0 as
    float32 does, so that gradient came out 1e13 times its float64 value."""

    def __init__(self):
        super().__init__()
        self.gate, self.rest, self.head = nn.Linear(4, 1), nn.Linear(4, 1), nn.Linear(4, 3)
        with torch.no_grad():
            self.gate.bias.fill_(-120.0)

    def forward(self, x):
        w = F.softmax(torch.cat([self.rest(x), self.gate(x)], 1), dim=1)
        return self.head(x) * w[:, :1] + self.head(x * 2) * w[:, 1:]


@pytest.mark.parametrize("optimizer", [ub.Adam(lr=1e-2), ub.SGD(lr=0.1, momentum=0.9)])
def test_a_gradient_through_an_underflowing_exp(optimizer, tmp_path):
    torch.manual_seed(0)
    assert_match(judge(VanishingSoftmaxWeight(), batches((4, 4), 3), optimizer, tmp_path))
