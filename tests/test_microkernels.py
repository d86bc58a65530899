"""Micro-kernels (kernels/microkernels/): every intrinsic variant against the scalar variant,
and both against PyTorch in float64, forward and backward (conv, depthwise conv, matmul),
under the target's emulator.

The kernels are made the way a training graph makes them (a Relax conv2d or matmul and its
Relax Gradient, legalized with the tagging rules), printed once as the scalar kernel and
rendered once as the ISA's micro-kernel. All cases of a target go into one program: one
cross build and one emulator run per target. Tolerance: the float32 error bound of a sum of K
products, |err| <= K * 2^-24 * sum|a_i b_i| (Higham, recursive summation); it holds for any
order of summation, and the two variants must be within twice that of each other.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from harness import require_tools

from tools.microkernels import harness
from tools.microkernels.cases import (
    batch_norm_funcs,
    conv2d_funcs,
    linear_funcs,
    matmul_funcs,
    max_pool2d_backward_funcs,
)
from ubitrain.kernels.library import KernelLibrary
from ubitrain.kernels.microkernels import plan, tile
from ubitrain.kernels.microkernels.manifest import GEMM_CORES
from ubitrain.ops.tagging import op_info
from ubitrain.program.bn_activation import masked_backward_kernel
from ubitrain.program.depthwise_input import depthwise_input_kernel
from ubitrain.targets import TARGETS

# (x shape, w shape, stride, padding, dilation): odd sizes leave row and column tails in the
# register tile; stride 2 with 8 rows leaves a remainder the weight gradient must skip.
CONV_CASES = [
    ((2, 3, 9, 9), (5, 3, 3, 3), (2, 2), (1, 1), (1, 1)),
    ((2, 4, 8, 7), (6, 4, 3, 3), (1, 1), (1, 1), (1, 1)),
    ((1, 2, 12, 10), (9, 2, 5, 5), (1, 1), (0, 0), (1, 1)),
    ((2, 3, 11, 11), (4, 3, 3, 3), (1, 1), (2, 2), (1, 1)),  # (Relax has no gradient of
    # a dilated conv: its conv2d_transpose refuses the output padding it asks for)
    ((2, 2, 8, 8), (3, 2, 3, 3), (2, 2), (1, 1), (1, 1)),  # dW without bottom/right padding
    ((2, 2, 8, 8), (3, 2, 3, 3), (2, 2), (0, 0), (1, 1)),  # dW of the input less a row, column
    ((1, 2, 10, 11), (4, 2, 3, 3), (2, 3), (1, 1), (1, 1)),  # phase planes of unequal strides
    ((2, 8, 6, 6), (12, 8, 1, 1), (1, 1), (0, 0), (1, 1)),
    # 1x1 weight gradients as GEMMs: dw (O >= C), then dw^T (O < C), both transposed
    ((2, 16, 5, 7), (19, 16, 1, 1), (1, 1), (0, 0), (1, 1)),
    ((2, 21, 3, 5), (16, 21, 1, 1), (1, 1), (0, 0), (1, 1)),
    ((1, 1, 30, 30), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1)),  # several packed row blocks
    ((2, 3, 7, 19), (1, 3, 3, 3), (1, 1), (1, 1), (1, 1)),  # one output channel: direct runs
    # the data gradient into one channel of narrow rows: several rows to a run (and the rest)
    ((2, 1, 6, 5), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1)),
    # rows of 10 fill 10 of 16 lanes: the forward packs blocks of rows even at stride 1
    ((16, 3, 12, 12), (8, 3, 3, 3), (1, 1), (0, 0), (1, 1)),
]
MATMUL_CASES = [(6, 13, 19), (1, 7, 3), (9, 33, 8), (4, 400, 120)]
# max_pool2d gradient: (x shape, kernel, stride, padding, dilation, ceil mode)
MAX_POOL_CASES = [((2, 3, 6, 6), (2, 2), (2, 2), (0, 0), (1, 1), False),
                  ((1, 2, 7, 7), (3, 3), (2, 2), (1, 1), (1, 1), False),
                  ((2, 2, 5, 5), (2, 2), (1, 1), (0, 0), (1, 1), False),
                  ((1, 2, 6, 6), (2, 2), (1, 1), (1, 1), (2, 2), False),
                  ((1, 2, 5, 5), (2, 2), (2, 2), (0, 0), (1, 1), True)]
# strided depthwise (direct loops): (x shape, w shape, stride, padding); the weight
# gradient of (1, 3, 8, 8) stride 2 pad 1 leaves out the bottom and right padding (whole, it
# would give 4x4 taps), that of (2, 2, 7, 10) its right padding
STRIDED_DEPTHWISE_CASES = [((2, 4, 9, 9), (4, 1, 3, 3), (2, 2), (1, 1)),
                           ((1, 3, 8, 8), (3, 1, 3, 3), (2, 2), (1, 1)),
                           ((2, 2, 7, 10), (2, 1, 3, 2), (2, 3), (0, 1)),
                           # data gradients with phase rows of 4 and 8: vectors of sums
                           ((2, 3, 16, 16), (3, 1, 3, 3), (2, 2), (1, 1)),
                           ((1, 2, 32, 32), (2, 1, 3, 3), (2, 2), (1, 1))]
# depthwise (groups = channels): (x shape, w shape, padding, dilation), stride 1
DEPTHWISE_CASES = [
    ((2, 5, 9, 7), (5, 1, 3, 3), (1, 1), (1, 1)),
    ((3, 4, 8, 8), (4, 1, 5, 5), (2, 2), (1, 1)),
    ((2, 6, 6, 10), (6, 1, 3, 3), (0, 0), (1, 1)),
    ((1, 3, 5, 21), (3, 1, 3, 3), (1, 1), (1, 1)),  # rows of 21: a run of 16, then 4 + 1
    ((2, 3, 6, 3), (3, 1, 3, 3), (1, 1), (1, 1)),  # rows of 3: single sums only
]
# BatchNorm statistics and backward: x shapes; planes of 30 leave a tail of 6 (vectors of 8)
# or 2 (of 4); accumulated in float64 and in float32 (cortex-m4, hexagon-v66) alike.
BATCH_NORM_CASES = [(2, 3, 5, 6), (3, 2, 4, 4), (2, 4, 17)]
BN_EPS, BN_MOMENTUM = 1e-5, 0.1
MICRO_TARGETS = sorted(name for name, t in TARGETS.items() if t.kernel_isa("float32") in GEMM_CORES)
# The host's avx2 kernels are built as a host project builds them, for the building machine
# (-march=native: the GEMM cores inlined into the kernels), and twice more: for the baseline
# ISA (the cores out of line, behind the run-time AVX2 check), and with -DUB_NO_AVX2 (their
# plain-C fallback, what a processor without AVX2/FMA, or a compiler without GNU C's target
# attributes, runs). Each build: (target, a define ahead of the kernels, CMake arguments).
BUILDS = {name: (name, None, ()) for name in MICRO_TARGETS}
BUILDS["host-baseline"] = ("host", None, ("-DUB_NATIVE=OFF",))
BUILDS["host-portable"] = ("host", "UB_NO_AVX2", ("-DUB_NATIVE=OFF",))


def _funcs():
    """(label, PrimFunc), forward and both gradients of every case, each kernel once."""
    out, seen = [], set()

    def add(funcs, case: str):
        for f in funcs:
            if f.attrs["ub_op"] not in seen:
                seen.add(f.attrs["ub_op"])
                info = op_info(f)
                nt = " (B transposed)" if info["attrs"].get("transpose_b") else ""
                out.append((f"{info['op']}{info['shapes']}{nt} {case}".rstrip(), f))

    for xs, ws, s, p, d in CONV_CASES:
        add(conv2d_funcs(xs, ws, s, p, d), f"s{s} p{p} d{d}")
    for xs, ws, p, d in DEPTHWISE_CASES:
        add(conv2d_funcs(xs, ws, padding=p, dilation=d, groups=xs[1]), f"depthwise p{p} d{d}")
    for xs, ws, st, p in STRIDED_DEPTHWISE_CASES:
        add(conv2d_funcs(xs, ws, stride=st, padding=p, groups=xs[1]), f"depthwise s{st} p{p}")
    for m, k, n in MATMUL_CASES:
        add(matmul_funcs(m, k, n) + linear_funcs(m, k, n), "")
    for xs, k, st, p, d, ceil in MAX_POOL_CASES:
        add(max_pool2d_backward_funcs(xs, k, st, p, d, ceil),
            f"x{list(xs)} k{k} s{st} p{p} d{d} ceil={ceil}")
    for xs in BATCH_NORM_CASES:
        for acc in ("float64", "float32"):
            add(batch_norm_funcs(xs, acc, BN_MOMENTUM, BN_EPS), acc)
    return out


FUNCS = _funcs()
# The gradient masks BatchNorm's backward takes in: a ReLU's, a ReLU6's
MASKS = [(0.0, None), (0.0, 6.0)]
BN_BACKWARDS = [f for _, f in FUNCS if op_info(f)["op"] == "batch_norm_train_backward"]
# depthwise weight gradients, strided (direct loops) and not: x channel-major or as stored
DEPTHWISE_WEIGHT_GRADS = [f for _, f in FUNCS if op_info(f)["op"] == "relax.nn.conv2d"
                          and op_info(f)["attrs"]["groups"] > 1
                          and op_info(f)["attrs"]["data_layout"] == "CNHW"]


def batch_norm_inputs(func, x, rng):
    """Inputs of a BatchNorm kernel around x: for the backward, the statistics of x rounded to
    float32 (as the forward saves them), so that PyTorch's own backward is the reference."""
    channels = x.shape[1]
    if op_info(func)["op"] == "batch_norm_stats":  # x, running mean, running variance
        # means far from zero against a spread of one: a variance taken as the mean square
        # less the squared mean, unshifted, loses it (float32 sums: most of its digits)
        x = x + np.float32(64) * np.arange(channels, dtype=np.float32).reshape(
            (1, channels) + (1,) * (x.ndim - 2))
        return [x, rng.standard_normal(channels).astype(np.float32),
                rng.uniform(0.5, 2, channels).astype(np.float32)]
    axes = (0,) + tuple(range(2, x.ndim))
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axes), x64.var(axes)
    return [x, rng.standard_normal(channels).astype(np.float32), mean.astype(np.float32),
            (1 / np.sqrt(var + BN_EPS)).astype(np.float32),
            rng.standard_normal(x.shape).astype(np.float32)]


def batch_norm_reference(info, inputs, split=False):
    """(value, magnitude, terms) of every output, one after the other, from PyTorch in
    float64: a sum of n terms rounds within n * 2^-24 of its magnitude (float32 sums), a
    float64 sum rounded once to float32 within 2^-24; the terms below add a few roundings of
    the float32 arithmetic around the sums. `split`: a backward whose float64 sums add up
    float32 sums of each plane (render.py's split, PyTorch's CPU backward), within a plane's
    H * W roundings of the sum of their magnitudes; a mean taken from them is off by that
    many roundings of the mean magnitude, which dx's magnitude takes in."""
    x = torch.from_numpy(inputs[0].astype(np.float64))
    axes = [0] + list(range(2, x.ndim))
    per_channel = [1, -1] + [1] * (x.ndim - 2)
    n = x.numel() // x.shape[1]
    sums = 0 if info["attrs"]["acc"] == "float64" else n
    if split:
        sums = math.prod(x.shape[2:])
    if info["op"] == "batch_norm_stats":
        rm, rv = (torch.from_numpy(v.astype(np.float64)) for v in inputs[1:])
        var, mean = torch.var_mean(x, axes, unbiased=False)
        rstd = 1 / torch.sqrt(var + BN_EPS)
        m = BN_MOMENTUM
        new_mean, new_var = (1 - m) * rm + m * mean, (1 - m) * rv + m * var * n / (n - 1)
        values = [mean, rstd, new_mean, new_var]
        magnitudes = [x.abs().mean(axes), rstd, (1 - m) * rm.abs() + m * mean.abs(),
                      (1 - m) * rv.abs() + m * var * n / (n - 1)]
        terms = [2 + sums, 2 + sums, 4 + sums, 4 + sums]
    else:
        w, _, _, dy = (torch.from_numpy(v.astype(np.float64)) for v in inputs[1:])
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        F.batch_norm(xg, None, None, wg, torch.zeros_like(w), training=True,
                     eps=BN_EPS).backward(dy)
        rstd = torch.from_numpy(inputs[3].astype(np.float64)).reshape(per_channel)
        x_hat = (x - torch.from_numpy(inputs[2].astype(np.float64)).reshape(per_channel)) * rstd
        mean_dy, mean_dy_xhat = dy.mean(axes, keepdim=True), (dy * x_hat).mean(axes, keepdim=True)
        if sums:  # a float32 sum errs by roundings of Σ|terms|, which |its mean| understates
            # where the terms cancel (another random draw: 3x the bound, on every ISA)
            mean_dy, mean_dy_xhat = (v.abs().mean(axes, keepdim=True) for v in (dy, dy * x_hat))
        values = [xg.grad, wg.grad, dy.sum(axes)]
        magnitudes = [(w.reshape(per_channel) * rstd).abs() * (dy.abs() + mean_dy.abs()
                                                               + (x_hat * mean_dy_xhat).abs()),
                      (dy * x_hat).abs().sum(axes), dy.abs().sum(axes)]
        terms = [8 + sums, 4 + sums, 1 + sums]
    flat = [v.detach().numpy().reshape(-1) for v in values]
    return (np.concatenate(flat), np.concatenate([m.detach().numpy().reshape(-1)
                                                  for m in magnitudes]),
            np.concatenate([np.full(v.size, t, np.float64) for v, t in zip(flat, terms)]))


def reference(func, inputs, isa):
    """(value, sum of |products|, terms per output element) in float64, from PyTorch."""
    info, a = op_info(func), func.attrs
    if info["op"].startswith("batch_norm"):
        return batch_norm_reference(info, inputs, plan(func, isa)[2].get("split", False))
    out_shape = [int(x) for x in func.params[-1].shape]
    x, y = (torch.from_numpy(v.astype(np.float64)) for v in inputs)
    at = info["attrs"]

    groups = at.get("groups", 1)
    if info["op"] == "relax.grad.max_pool2d_backward":  # inputs: dy, x
        pool = dict(kernel_size=at["pool_size"], stride=at["strides"],
                    padding=at["padding"][:2], dilation=at["dilation"])
        pool["ceil_mode"] = list(F.max_pool2d(y, **pool).shape) != list(x.shape)

        def grad(dy):
            xg = y.clone().requires_grad_(True)
            F.max_pool2d(xg, **pool).backward(dy)
            return xg.grad.numpy().reshape(-1)

        terms = math.prod(-(-k // s) for k, s in zip(at["pool_size"], at["strides"]))
        return grad(x), grad(x.abs()), terms

    def apply(u, v):
        if info["op"] == "relax.matmul":
            return u @ (v.T if at.get("transpose_b") else v)
        pad = at["padding"][:2]
        if info["op"] == "relax.nn.conv2d_transpose":
            return F.conv_transpose2d(u, v, stride=at["strides"], padding=pad,
                                      output_padding=at["output_padding"], groups=groups,
                                      dilation=at["dilation"])
        if at["data_layout"] == "NCHW":
            return F.conv2d(u, v, stride=at["strides"], padding=pad, dilation=at["dilation"],
                            groups=groups)
        # the weight gradient: Relax's stride is the forward dilation and vice versa; a
        # grouped one gets x channel-major, [C*N, 1, H, W]
        if groups > 1:
            n, c = v.shape[0], v.shape[1]
            u = u.reshape(c, n, *u.shape[2:]).transpose(0, 1)
        return torch.nn.grad.conv2d_weight(u, out_shape, v, stride=at["dilation"],
                                           padding=pad, dilation=at["strides"], groups=groups)

    if info["op"] == "relax.matmul":
        terms = x.shape[1]
    elif info["op"] == "relax.nn.conv2d_transpose":
        terms = y.shape[0] // groups * y.shape[2] * y.shape[3]
    elif at["data_layout"] == "NCHW":
        terms = y.shape[1] * y.shape[2] * y.shape[3]
    else:
        terms = y.shape[0] * y.shape[2] * y.shape[3]
    del a
    value, magnitude = apply(x, y), apply(x.abs(), y.abs())
    assert list(value.shape) == out_shape
    return value.numpy().reshape(-1), magnitude.numpy().reshape(-1), terms


# What every build shares, made once per process (by the first build; six builds ask): the
# scalar kernels, the inputs of FUNCS' cases and the rng's state after them, and the PyTorch
# references by (kernel, inputs, the ISA's BatchNorm split).
_SHARED: dict = {}


def _scalar_cases():
    """[(label, func, scalar kernel, inputs)] of FUNCS, and the rng's state after drawing them."""
    if "cases" not in _SHARED:
        rng = np.random.default_rng(7)
        out = []
        for label, func in FUNCS:
            info = op_info(func)
            inputs = [rng.standard_normal(shape).astype(np.float32) for shape in info["shapes"]]
            if info["op"] == "relax.grad.max_pool2d_backward":  # x in whole numbers:
                inputs[1] = np.round(inputs[1])  # windows with tied maxima
            if info["op"].startswith("batch_norm"):
                inputs = batch_norm_inputs(func, inputs[0], rng)
            out.append((label, func, KernelLibrary("scalar").add(func, "k"), inputs))
        _SHARED["cases"] = out, rng.bit_generator.state
    return _SHARED["cases"]


def shared_reference(func, inputs, isa):
    """reference(), computed once for the same kernel, inputs and BatchNorm split (the only
    part of the reference an ISA changes)."""
    split = (op_info(func)["op"].startswith("batch_norm")
             and plan(func, isa)[2].get("split", False))
    key = (id(func), split, tuple((a.dtype.str, a.shape, a.tobytes()) for a in inputs))
    refs = _SHARED.setdefault("refs", {})
    if key not in refs:
        refs[key] = reference(func, inputs, isa)
    return refs[key]


@pytest.fixture(scope="module", params=list(BUILDS))
def isa_run(request, tmp_path_factory):
    """Per build: every case built once as scalar and micro-kernel, run in one emulator
    process."""
    name, define, cmake_args = BUILDS[request.param]
    target = TARGETS[name]
    isa = target.kernel_isa("float32")
    require_tools(target.name)
    scalar_cases, rng_state = _scalar_cases()
    rng = np.random.default_rng(7)
    rng.bit_generator.state = rng_state
    cases, support, refs = [], {}, []
    if define:
        support["define"] = f"#define {define} 1\n"  # ahead of the kernels' code
    for label, func, scalar, inputs in scalar_cases:
        lib = KernelLibrary(isa)
        micro = lib.add(func, "k")
        support.update(lib.support)
        cases.append(harness.Case(label, [scalar, micro], inputs))
        refs.append(shared_reference(func, inputs, isa))
    for lo, hi in MASKS:
        for func in BN_BACKWARDS:
            lib = KernelLibrary(isa)
            plain = lib.add(func, "k")
            masked = lib.kernels[masked_backward_kernel(lib, plain.name, lo, hi)]
            x, w, mean, rstd, dz = batch_norm_inputs(func, rng.standard_normal(
                op_info(func)["shapes"][0]).astype(np.float32), rng)
            # the activation's output: exactly lo and hi (where it clamps), between, beyond
            z = np.clip(np.round(4 * rng.standard_normal(x.shape)), -1, 7).astype(np.float32)
            z = np.clip(z, lo, hi if hi is not None else None)
            dy = np.where((lo < z) & (z < (np.inf if hi is None else hi)), dz, np.float32(0))
            cases.append(harness.Case(f"masked {lo},{hi}", [plain], [x, w, mean, rstd, dy]))
            cases.append(harness.Case(f"masked {lo},{hi}", [masked], [x, w, mean, rstd, dz, z]))
            refs.append(shared_reference(func, [x, w, mean, rstd, dy], isa))
    for func in DEPTHWISE_WEIGHT_GRADS:
        lib = KernelLibrary(isa)
        plain = lib.add(func, "k")
        as_stored = lib.kernels[depthwise_input_kernel(lib, plain.name)]
        x, dy = (rng.standard_normal(shape).astype(np.float32)
                 for shape in op_info(func)["shapes"])
        n, c = dy.shape[:2]  # x comes channel-major, [C * N, 1, H, W]
        x_nchw = np.ascontiguousarray(x.reshape(c, n, *x.shape[2:]).swapaxes(0, 1))
        cases.append(harness.Case("x channel-major", [plain], [x, dy]))
        cases.append(harness.Case("x as stored", [as_stored], [x_nchw, dy]))
    binary = harness.build(cases, support, target, tmp_path_factory.mktemp(f"uk_{name}"),
                           cmake_args)
    return isa, cases, harness.run(binary, target, cases), refs


@pytest.mark.parametrize("index", range(len(FUNCS)), ids=[label for label, _ in FUNCS])
def test_microkernel_matches_scalar_and_pytorch(isa_run, index):
    isa, cases, results, refs = isa_run
    case, ((s_status, scalar, _), (m_status, micro, _)), (want, magnitude, terms) = \
        cases[index], results[index], refs[index]
    assert case.variants[0].name.endswith("__scalar")
    family = plan(FUNCS[index][1], isa)[0]
    assert case.variants[1].name.endswith(f"_ukernel_{tile(isa, family)}__{isa}"), \
        case.variants[1].name
    assert s_status == 0 and m_status == 0
    bound = terms * 2.0**-24 * magnitude + 1e-30
    for name, got in (("scalar", scalar), (isa, micro)):
        excess = np.abs(got - want) / bound
        assert np.all(excess <= 1), f"{name}: worst {excess.max():.2f}x the float32 bound"
    assert np.all(np.abs(micro - scalar) <= 2 * bound)


@pytest.mark.parametrize("index", range(len(MASKS) * len(BN_BACKWARDS)))
def test_batch_norm_backward_with_the_activation_mask_matches_the_masked_dy(isa_run, index):
    """BatchNorm's backward reading dz and z (program/bn_activation.py) gives, bit for bit,
    what the plain micro-kernel gives on dy = where(lo < z < hi, dz, 0), and PyTorch's."""
    _, cases, results, refs = isa_run
    at = len(FUNCS) + 2 * index
    (p_status, plain, _), = results[at]
    (m_status, masked, _), = results[at + 1]
    assert p_status == 0 and m_status == 0 and cases[at + 1].variants[0].name != \
        cases[at].variants[0].name
    assert np.array_equal(plain.view(np.uint32), masked.view(np.uint32))
    want, magnitude, terms = refs[len(FUNCS) + index]
    assert np.all(np.abs(masked - want) <= terms * 2.0**-24 * magnitude + 1e-30)


@pytest.mark.parametrize("index", range(len(DEPTHWISE_WEIGHT_GRADS)))
def test_depthwise_weight_gradient_reading_x_as_stored_matches(isa_run, index):
    """The depthwise weight gradient that reads x [N, C, H, W] as stored
    (program/depthwise_input.py) gives, bit for bit, what it gives on the channel-major copy
    Relax passes."""
    _, cases, results, _ = isa_run
    at = len(FUNCS) + 2 * len(MASKS) * len(BN_BACKWARDS) + 2 * index
    (p_status, plain, _), = results[at]
    (s_status, as_stored, _), = results[at + 1]
    assert p_status == 0 and s_status == 0
    assert cases[at + 1].variants[0].name != cases[at].variants[0].name
    assert np.array_equal(plain.view(np.uint32), as_stored.view(np.uint32))


def test_ops_without_a_micro_kernel_keep_the_scalar_kernel():
    """Grouped (not depthwise) convs have no micro-kernel: the library prints the scalar
    kernel for them on every ISA."""
    funcs = conv2d_funcs((2, 4, 8, 8), (6, 2, 3, 3), padding=(1, 1), groups=2)
    for isa in GEMM_CORES:
        for func in funcs:
            assert KernelLibrary(isa).add(func, "k").name.endswith("__scalar")


@pytest.mark.parametrize("target", MICRO_TARGETS)
def test_compiled_model_calls_the_micro_kernels(target, tmp_path):
    """ub.compile for a micro-kernel target puts them in the step: the conv forward, both
    conv gradients, the linear layer's matmuls and BatchNorm's statistics and backward (this
    one in place, over its input), each rendered once from its template."""
    import torch

    import ubitrain as ub
    from ubitrain.zoo import ZOO

    entry = ZOO["digits_cnn"]
    x, y = torch.randn((4,) + entry.sample_shape), torch.randint(0, 10, (4,))
    ub.compile(entry.factory(), (x,), y, target=target, out_dir=tmp_path / "m")
    source = (tmp_path / "m" / "model.c").read_text()
    isa = TARGETS[target].kernel_isa("float32")
    tile = GEMM_CORES[isa].tile
    called = set(re.findall(rf"UB_TRY\((ub_f32_(\w+?)\d*_ukernel_(?:{tile}|u\d+)__{isa})\(",
                            source))
    ops = {op for _, op in called}
    assert {"conv2d", "conv2d_bwd_data", "conv2d_bwd_weight", "matmul", "batch_norm_stats",
            "batch_norm_backward"} <= ops, ops
    # the backward's dx over its input x: the same arena address, the 2nd and 6th tensor
    (x, dx), = re.findall(r"UB_TRY\(ub_f32_batch_norm_backward\w*\(\w[^,]*, (\([^)]*\)[^,]*),"
                          r"(?:[^,]*,){4} (\([^)]*\)[^,]*),", source)
    assert x.replace("const ", "") == dx, (x, dx)
    assert "microkernels/templates/common/conv2d.c.j2" in source
    assert "microkernels/templates/common/batch_norm.c.j2" in source
    assert f"microkernels/templates/{GEMM_CORES[isa].template}" in source
