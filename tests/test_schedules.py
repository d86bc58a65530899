"""The tiled schedule against the unscheduled one: same numbers, and the loop shape it promises
(no init condition in the loop nest, a unit-stride spatial loop innermost)."""

import numpy as np
import pytest
import tvm
from tvm import te, topi

from ubitrain.kernels.c_printer import print_kernel
from ubitrain.kernels.schedules import SCHEDULES
from ubitrain.lowering.tir_lower import lower_prim_func


def _conv(n=2, c=3, f=6, hw=10, k=3, pad=1, stride=1):
    x = te.placeholder((n, c, hw, hw), "float32", "x")
    w = te.placeholder((f, c, k, k), "float32", "w")
    return [x, w, topi.nn.conv2d_nchw(x, w, stride, pad, 1)]


def _conv_transpose():
    x = te.placeholder((2, 8, 6, 6), "float32", "x")
    w = te.placeholder((8, 4, 3, 3), "float32", "w")
    return [x, w, topi.nn.conv2d_transpose_nchw(x, w, (1, 1), (1, 1), "float32", (0, 0))]


def _weight_grad():  # the conv weight gradient's shape: a 3x3 output, a 12x12 reduction
    x = te.placeholder((4, 2, 14, 14), "float32", "x")  # [C, N, H, W]
    g = te.placeholder((4, 6, 12, 12), "float32", "g")
    return [x, g, topi.nn.conv2d_nchw(x, g, 1, 0, 1)]


def _matmul(m=5, k=20, n=24):
    a = te.placeholder((m, k), "float32", "a")
    b = te.placeholder((k, n), "float32", "b")
    return [a, b, topi.matmul(a, b)]


def _dot_nt(k=620, n=2):  # a Linear(k, n) at batch 1: x @ w.T, no output axis to vectorise
    x = te.placeholder((1, k), "float32", "x")
    w = te.placeholder((n, k), "float32", "w")
    r = te.reduce_axis((0, k), "r")
    return [x, w, te.compute((1, n), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), "dot")]


def _depthwise():
    x = te.placeholder((2, 8, 9, 9), "float32", "x")
    w = te.placeholder((8, 1, 3, 3), "float32", "w")
    return [x, w, topi.nn.depthwise_conv2d_nchw(x, w, 2, 1, 1)]


def _relu6():  # elementwise over a small feature map: an innermost loop of 8
    x = te.placeholder((4, 16, 8, 8), "float32", "x")
    return [x, topi.clip(x, 0.0, 6.0)]


def _scale_per_channel():  # a broadcast operand: its index is not the output's
    x = te.placeholder((4, 16, 8, 8), "float32", "x")
    s = te.placeholder((16,), "float32", "s")
    return [x, s, te.compute(x.shape, lambda n, c, h, w: x[n, c, h, w] * s[c], "scaled")]


def _channel_sum_float64():  # BatchNorm's statistics: per channel over N, H, W, in float64
    x = te.placeholder((3, 4, 6, 16), "float32", "x")
    n, h, w = (te.reduce_axis((0, d), name=name) for d, name in ((3, "n"), (6, "h"), (16, "w")))
    total = te.compute((4,), lambda c: te.sum(x[n, c, h, w].astype("float64"), axis=[n, h, w]),
                       "total")
    return [x, te.compute((4,), lambda c: total[c].astype("float32"), "sum")]


def _max_pool_narrow():  # LeNet-5's second max-pool: output rows of 5, read with stride 2
    x = te.placeholder((2, 4, 10, 10), "float32", "x")
    return [x, topi.nn.pool2d(x, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), "max")]


def _concat(n):  # channels of two tensors: which one a fused index reads is a comparison
    a, b = (te.placeholder((n, 2, 10, 8), "float32", name) for name in "ab")
    return [a, b, topi.concatenate((a, b), axis=1)]


CASES = {"conv": _conv, "conv_strided": lambda: _conv(stride=2, hw=9), "matmul": _matmul,
         "dot_620": _dot_nt, "matmul_620": lambda: _matmul(m=1, k=620, n=2),
         "max_pool_narrow": _max_pool_narrow,
         "conv_transpose": _conv_transpose, "weight_grad": _weight_grad,
         "depthwise": _depthwise, "relu6": _relu6, "scale_per_channel": _scale_per_channel,
         "channel_sum_float64": _channel_sum_float64, "concat_one_sample": lambda: _concat(1),
         "concat_two_samples": lambda: _concat(2)}


def _run(func, arrays):
    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    lib["main"](*args)
    return args[-1].numpy()


@pytest.mark.parametrize("case", list(CASES))
def test_tiled_schedule_matches_unscheduled(case):
    tensors = CASES[case]()
    func = te.create_prim_func(tensors)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([int(d) for d in t.shape]).astype("float32")
              for t in tensors[:-1]]
    arrays.append(np.zeros([int(d) for d in tensors[-1].shape], "float32"))
    ref = _run(SCHEDULES["inline_only"](func), [a.copy() for a in arrays])
    got = _run(SCHEDULES["default"](func), [a.copy() for a in arrays])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["conv", "matmul", "conv_transpose"])
def test_tiled_conv_and_matmul_have_no_condition_in_the_loop_nest(case):
    func = te.create_prim_func(CASES[case]())
    tiled = print_kernel(lower_prim_func(SCHEDULES["default"](func)), "k").source
    plain = print_kernel(lower_prim_func(SCHEDULES["inline_only"](func)), "k").source
    assert "== 0)" in plain  # the unscheduled init condition: if (k == 0) out = 0
    assert "== 0)" not in tiled


def test_short_elementwise_nest_becomes_one_loop_without_divisions():
    """gcc does not vectorise an elementwise nest whose innermost loop is short; the schedule
    fuses it into one loop, but not where that would index an operand by division."""
    def printed(case):
        func = te.create_prim_func(CASES[case]())
        return print_kernel(lower_prim_func(SCHEDULES["default"](func)), "k").source

    relu6, scaled = printed("relu6"), printed("scale_per_channel")
    assert relu6.count("for (") == 1
    assert scaled.count("for (") == 4
    assert "floordiv" not in scaled and "floormod" not in scaled and "%" not in scaled


def test_concatenation_fuses_where_its_condition_needs_no_division():
    """The count judges a condition as lowering simplifies it, whole: fused, one sample's
    `ax1 >= 2` is `160 <= f`; two samples' would need `f % 320`, so their nest stays."""
    def printed(case):
        func = te.create_prim_func(CASES[case]())
        return print_kernel(lower_prim_func(SCHEDULES["default"](func)), "k").source

    one, two = printed("concat_one_sample"), printed("concat_two_samples")
    assert one.count("for (") == 1 and "160 <= " in one
    assert two.count("for (") == 4 and "%" not in two


def test_float64_channel_sum_runs_each_plane_as_one_loop_of_partial_sums():
    """gcc vectorises the widening float64 sums of BatchNorm only over a plane fused into one
    loop (split in vectors of 8 partial sums), not over rows split in two loops: a block the
    schedule fails on would stay unscheduled silently, so the loop shape is checked."""
    func = te.create_prim_func(CASES["channel_sum_float64"]())
    tiled = print_kernel(lower_prim_func(SCHEDULES["default"](func)), "k").source
    assert "total_rf" in tiled and "h_w_fused" in tiled


def test_narrow_max_pool_runs_its_output_row_innermost():
    """Rows of 5 outputs are still the vector axis (four lanes and a tail): innermost, not a
    scalar loop over the 2x2 window whose compares branch on the data."""
    func = te.create_prim_func(CASES["max_pool_narrow"]())
    tiled = print_kernel(lower_prim_func(SCHEDULES["default"](func)), "k").source
    plain = print_kernel(lower_prim_func(SCHEDULES["inline_only"](func)), "k").source
    innermost = [line for line in tiled.splitlines() if "for (" in line][-1]
    assert "< 5;" in innermost
    assert "< 5;" not in [line for line in plain.splitlines() if "for (" in line][-1]


def test_long_dot_product_sums_in_partial_sums():
    """A Linear(620, 2) at batch 1 (or x @ w with w 620x2) has no vector axis in its output:
    its 620-long reduction (not a multiple of 8) is split in 8 partial sums, the last chunk
    predicated, not summed in one float32 chain (which rounds several times worse than
    float32 PyTorch)."""
    for case in ("dot_620", "matmul_620"):  # unit-stride reads, and strided ones
        func = te.create_prim_func(CASES[case]())
        tiled = print_kernel(lower_prim_func(SCHEDULES["default"](func)), "k").source
        assert "_rf" in tiled and "< 620)" in tiled, case
