"""NITI's integer kernels (lowering/niti_kernels.py) as the generated C computes them, against
the numpy rules of int8/ (rounding, quantize, rescale sites, the integer softmax gradient), on
random inputs over wide ranges of magnitudes and exponents.

Each kernel goes through the same path as a model's: KernelLibrary lowers and prints it, gcc
builds it, ctypes calls it."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import numpy as np
import pytest
from tvm import te

from ubitrain.kernels.library import KernelLibrary
from ubitrain.lowering import niti_batch_norm_kernels, niti_kernels
from ubitrain.niti import align, batch_norm, loss, micro_batches, quantize, rounding, tables
from ubitrain.niti.rescale import ADAPTIVE, EXACT_COUNTED, EXPONENT, site_shift
from ubitrain.niti.update import niti_update
from ubitrain.project.emit import RUNTIME_C

N = 37  # elements of the elementwise cases
BATCH, CLASSES = 4, 10
TRIALS = 200
ROWS = tables.E_HI - tables.E_LO + 1  # a table per input exponent

def _placeholders(spec):
    return [te.placeholder(shape, dtype, f"in{i}") for i, (shape, dtype) in enumerate(spec)]


CASES = {  # name -> (kernel, input (shape, dtype)s, attributes)
    "rescale_counted": (niti_kernels.niti_rescale,
                        [((N,), "int32"), ((1,), "int32"), ((1,), "int32"), ((6,), "int32")],
                        {"mode": EXACT_COUNTED, "max_interval": 8}),
    "rescale_adaptive": (niti_kernels.niti_rescale,
                         [((N,), "int32"), ((1,), "int32"), ((1,), "int32"), ((6,), "int32")],
                         {"mode": ADAPTIVE, "max_interval": 8}),
    "quantize": (niti_kernels.niti_quantize, [((N,), "float32")], {}),
    "dequantize": (niti_kernels.niti_dequantize, [((N,), "int8"), ((1,), "int32")], {}),
    "align_add": (niti_kernels.niti_align_add,
                  [((N,), "int8"), ((1,), "int32"), ((N,), "int8"), ((1,), "int32")], {}),
    "align_concat": (niti_kernels.niti_align_concat,  # three parts on axis 1
                     [((2, 3, 4), "int8"), ((2, 1, 4), "int8"), ((2, 5, 4), "int8"),
                      ((1,), "int32"), ((1,), "int32"), ((1,), "int32")], {"axis": 1}),
    "bound6": (niti_kernels.niti_int8_bound, [((1,), "int32")], {"value": 6}),
    "align_bias": (niti_kernels.niti_align_bias,
                   [((3, 5, 2), "int32"), ((1,), "int32"), ((1,), "int32"), ((5,), "int32"),
                    ((1,), "int32")], {}),
    "align_bias_one": (niti_kernels.niti_align_bias,  # one element: its stages inlined
                       [((1, 1), "int32"), ((1,), "int32"), ((1,), "int32"), ((1,), "int32"),
                        ((1,), "int32")], {}),
    "accumulate": (niti_kernels.niti_accumulate,
                   [((N,), "int32"), ((1,), "int32"), ((N,), "int32"), ((1,), "int32")], {}),
    **{f"update_{kind}_{n}": (niti_kernels.niti_update,
                              [((n,), dtype), ((n,), "int32"), ((1,), "float32")], {})
       for kind, dtype in (("weight", "int8"), ("bias", "int32")) for n in (N, 1)},
    "batch_norm_train": (niti_batch_norm_kernels.niti_batch_norm_train,
                         [((4, 3, 5, 6), "int8"), ((3,), "int32"), ((3,), "int32"),
                          ((1,), "int32"), ((1,), "int32"), ((1,), "int32")],
                         {"momentum": 0.1}),
    "batch_norm_backward": (niti_batch_norm_kernels.niti_batch_norm_backward,
                            [((4, 3, 5, 6), "int8"), ((4, 3, 5, 6), "int8"), ((3,), "int64"),
                             ((3,), "int32")], {}),
    "batch_norm_eval": (niti_batch_norm_kernels.niti_batch_norm_eval,
                        [((4, 3, 5, 6), "int8"), ((1,), "int32"), ((3,), "int32"),
                         ((3,), "int32"), ((1,), "int32"), ((1,), "int32")], {}),
    "root": (lambda v, acc: list(niti_batch_norm_kernels.root(v, "root")),
             [((186,), "int64")], {}),
    "softmax_xent": (niti_kernels.niti_softmax_xent,
                     [((BATCH, CLASSES), "int8"), ((1,), "int32"), ((BATCH,), "int32")], {}),
    "table": (niti_kernels.niti_table, [((256,), "int8"), ((1,), "int32"), ((ROWS, 256), "int8"),
                                        ((ROWS,), "int32")], {}),
    "table_grad": (niti_kernels.niti_table_grad,
                   [((256,), "int8"), ((256,), "int8"), ((1,), "int32"), ((ROWS, 256), "int8"),
                    ((ROWS,), "int32")], {}),
}
# kernels a step program calls itself, not ops of the graph: no `acc` attribute
PROGRAM_KERNELS = (niti_kernels.niti_update, niti_kernels.niti_accumulate)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """name -> a function of numpy inputs that runs the printed C and returns its outputs."""
    cc = shutil.which("gcc") or pytest.skip("no gcc")
    library = KernelLibrary("scalar", reuse_outputs=False)
    signatures = {}
    for name, (kernel, spec, attrs) in CASES.items():
        inputs = _placeholders(spec)
        outs = kernel(*inputs, **attrs) if kernel in PROGRAM_KERNELS else \
            kernel(*inputs, **attrs, acc="float64")
        outs = outs if isinstance(outs, list) else [outs]
        c = library.add(te.create_prim_func(inputs + outs), f"niti_{name}")
        signatures[name] = (c, [(tuple(int(d) for d in o.shape), str(o.dtype)) for o in outs])
    work = tmp_path_factory.mktemp("niti")
    source = ['#include "ub_runtime.h"', '#include "ub_math.h"']
    source += [k.source.replace("UB_KERNEL ", "") for k in library.kernels.values()]
    (work / "k.c").write_text("\n".join(source))
    subprocess.run([cc, "-O2", "-std=c99", "-shared", "-fPIC", f"-I{RUNTIME_C}",
                    str(work / "k.c"), "-o", str(work / "k.so"), "-lm"], check=True)
    lib = ctypes.CDLL(str(work / "k.so"))

    def runner(c, outputs):
        scratch = np.zeros(max(c.scratch_bytes, 16), np.uint8)

        def run(*inputs):
            outs = [np.zeros(shape, dtype) for shape, dtype in outputs]
            args = [np.ascontiguousarray(a) for a in inputs] + outs
            fn = getattr(lib, c.name)
            fn.argtypes, fn.restype = [ctypes.c_void_p] * (1 + len(args)), ctypes.c_int32
            status = fn(scratch.ctypes.data, *(a.ctypes.data for a in args))
            assert status == 0
            return outs
        return run

    return {name: runner(c, outs) for name, (c, outs) in signatures.items()}


def _int32s(rng, shape):
    """int32 values whose magnitudes span 2^0 .. 2^30, some tensors all zero."""
    if rng.random() < 0.05:
        return np.zeros(shape, np.int32)
    scale = 2.0 ** rng.integers(0, 31)
    return np.clip(rng.standard_normal(shape) * scale, -2**31 + 1, 2**31 - 1).astype(np.int32)


def _exponent(rng, low=-40, high=10):
    return np.array([rng.integers(low, high)], np.int32)


@pytest.mark.parametrize("mode", ["counted", "adaptive"])
def test_rescale_narrows_and_updates_the_site_as_numpy(kernels, mode):
    rng = np.random.default_rng(1)
    run = kernels[f"rescale_{mode}"]
    for _ in range(TRIALS):
        acc, e1, e2 = _int32s(rng, (N,)), _exponent(rng), _exponent(rng)
        site = np.array([rng.integers(0, 25), rng.integers(0, 5), rng.integers(0, 3),
                         rng.integers(0, 9), rng.integers(0, 9), 0], np.int32)
        q, e, new_site = run(acc, e1, e2, site)
        want_site = site.astype(np.int64)
        shift = site_shift(acc, want_site, 7, ADAPTIVE if mode == "adaptive" else EXACT_COUNTED,
                           8)
        want_site[EXPONENT] = e1[0] + e2[0] + shift
        np.testing.assert_array_equal(q, rounding.clip8(rounding.round_shift(acc, shift)))
        assert e[0] == e1[0] + e2[0] + shift
        np.testing.assert_array_equal(new_site, want_site)


def test_quantize_takes_the_bits_of_every_float_as_numpy(kernels):
    rng = np.random.default_rng(2)
    for trial in range(TRIALS):
        x = (rng.standard_normal(N) * 2.0 ** rng.integers(-140, 120)).astype(np.float32)
        if trial % 20 == 0:
            x[:] = 0.0
        elif trial % 20 == 1:
            x[rng.random(N) < 0.5] = -0.0
        q, e = kernels["quantize"](x)
        want_q, want_e = quantize.quantize(x)
        np.testing.assert_array_equal(q, want_q)
        assert e[0] == want_e


def test_dequantize_is_exact(kernels):
    rng = np.random.default_rng(3)
    for _ in range(TRIALS):
        q = rng.integers(-127, 128, N).astype(np.int8)
        e = _exponent(rng, -140, 120)
        (got,) = kernels["dequantize"](q, e)
        np.testing.assert_array_equal(got, quantize.dequantize(q, int(e[0])))


def test_aligned_sum_is_exact_while_the_shift_fits(kernels):
    """a 2^ea + b 2^eb: exact (no rounding) when the exponents differ by at most 22 bits; the
    smaller term RoundShift'ed by the excess otherwise."""
    rng = np.random.default_rng(4)
    for _ in range(TRIALS):
        a, b = (rng.integers(-127, 128, N).astype(np.int8) for _ in range(2))
        ea, eb = _exponent(rng), _exponent(rng)
        total, e = kernels["align_add"](a, ea, b, eb)
        gap = abs(int(ea[0]) - int(eb[0]))
        left = min(gap, niti_kernels.ALIGN_BITS)
        big, small = (a, b) if ea[0] >= eb[0] else (b, a)
        want = (big.astype(np.int64) << left) + rounding.round_shift(small, gap - left)
        np.testing.assert_array_equal(total, want)
        assert e[0] == max(ea[0], eb[0]) - left
        if gap <= niti_kernels.ALIGN_BITS:  # the value itself, as integers times powers of 2
            value = lambda q, k: [int(v) * 2.0 ** int(k) for v in q]  # noqa: E731
            assert value(total, e[0]) == [x + y for x, y in zip(value(a, ea[0]),
                                                                value(b, eb[0]))]


def test_concat_aligns_its_parts_as_numpy(kernels):
    """Each part RoundShift'ed to max(coarsest - ALIGN_BITS, finest): exponent gaps beyond
    ALIGN_BITS included."""
    rng = np.random.default_rng(6)
    for _ in range(TRIALS):
        parts = [rng.integers(-127, 128, shape).astype(np.int8)
                 for shape in ((2, 3, 4), (2, 1, 4), (2, 5, 4))]
        exps = [_exponent(rng) for _ in parts]
        total, e = kernels["align_concat"](*parts, *exps)
        want, want_e = align.aligned_concat([(q, int(x[0])) for q, x in zip(parts, exps)], 1)
        np.testing.assert_array_equal(total, want)
        assert e[0] == want_e
        if max(exps)[0] - min(exps)[0] <= niti_kernels.ALIGN_BITS:  # exact: the values
            exact = np.concatenate([q * 2.0 ** int(x[0]) for q, x in zip(parts, exps)], 1)
            np.testing.assert_array_equal(total * 2.0 ** int(e[0]), exact)


def test_relu6_bound_is_six_at_every_exponent(kernels):
    """ReLU6's bound as an int8 code: 6 / 2^e rounded half away, clipped to 127, for every
    exponent an activation can have (and far beyond)."""
    for e in range(-80, 20):
        (got,) = kernels["bound6"](np.array([e], np.int32))
        assert got[0] == rounding.int8_bound(6, e)
        want = min(127, int(np.floor(6 / 2.0 ** e + 0.5)))  # half away from zero, 6 > 0
        assert got[0] == want, e


def test_table_functions_read_their_tables_as_numpy_at_every_exponent(kernels):
    """niti/tables.py: every int8 input at every exponent in the tables' range and beyond
    (brought to its edge), the forward entry and the backward's product, as table_index
    says. The tables are random, so that a wrong row or column cannot pass."""
    rng = np.random.default_rng(0)
    values = rng.integers(-127, 128, (ROWS, 256)).astype(np.int8)
    exponents = rng.integers(-20, 5, ROWS).astype(np.int32)
    q = np.arange(-128, 128).astype(np.int8)
    err = rng.integers(-127, 128, 256).astype(np.int8)
    for e in range(tables.E_LO - 12, tables.E_HI + 12):
        col, row = tables.table_index(q, e)
        y, ey = kernels["table"](q, np.array([e], np.int32), values, exponents)
        assert np.array_equal(y, values[row][col]) and ey[0] == exponents[row], e
        g, eg = kernels["table_grad"](err, q, np.array([e], np.int32), values, exponents)
        assert np.array_equal(g, err.astype(np.int64) * values[row][col]), e
        assert eg[0] == exponents[row]


@pytest.mark.parametrize("case", ["align_bias", "align_bias_one"])
def test_bias_is_aligned_to_the_accumulator(kernels, case):
    """acc 2^e + bias 2^eb as numpy's align_bias, for biases up to 2^30 and exponent gaps
    either way: the value itself (exact when the bias is finer by nothing, else within half
    of the result's last bit), and never beyond int32."""
    rng = np.random.default_rng(5)
    shape = (3, 5, 2) if case == "align_bias" else (1, 1)
    coarsened = 0
    for _ in range(TRIALS):
        acc = _int32s(rng, shape) >> 2  # below 2^30: the accumulators of int8 products
        bias = _int32s(rng, shape[1:2]) >> 1
        e1, e2, eb = _exponent(rng, -30, 0), _exponent(rng, -30, 0), _exponent(rng, -50, 0)
        got, coarser = kernels[case](acc, e1, e2, bias, eb)
        e = int(e1[0] + e2[0])
        want, want_coarser = align.align_bias(acc, e, bias, int(eb[0]))
        np.testing.assert_array_equal(got, want)
        assert coarser[0] == want_coarser
        coarsened += want_coarser > 0
        expanded = [1] * acc.ndim
        expanded[1] = -1
        exact = (acc.astype(object) * 2 ** (e - min(e, int(eb[0])))
                 + bias.reshape(expanded).astype(object) * 2 ** (int(eb[0]) - min(e, int(eb[0]))))
        scale = 2 ** (e + want_coarser - min(e, int(eb[0])))  # the result's LSB, in the
        error = np.abs(got.astype(object) * scale - exact)  # units of the finer exponent
        assert (2 * error <= scale + scale * (int(eb[0]) < e)).all()
    assert 0 < coarsened < TRIALS


def test_softmax_gradient_and_loss_as_numpy(kernels):
    rng = np.random.default_rng(6)
    for _ in range(TRIALS):
        z = rng.integers(-127, 128, (BATCH, CLASSES)).astype(np.int8)
        e = _exponent(rng, -12, 4)
        labels = rng.integers(0, CLASSES, BATCH).astype(np.int32)
        err, got_loss = kernels["softmax_xent"](z, e, labels)
        np.testing.assert_array_equal(err, loss.softmax_xent_grad(z, int(e[0]), labels))
        want = loss.cross_entropy(z, int(e[0]), labels)
        assert abs(float(got_loss) - want) <= 1e-6 * max(1.0, abs(want))


@pytest.mark.parametrize("n", [N, 1])
@pytest.mark.parametrize("kind", ["weight", "bias"])
def test_update_renormalizes_the_gradient_as_numpy(kernels, kind, n):
    """NITI's update (niti/update.py) for an int8 weight and an int32 bias, over gradients
    from 0 to 2^30 and every mu, so that the shift is 0 as often as it is large; a parameter
    of one element too (its shift inlined, PstoShift's rounding was lost: seed 203115)."""
    rng = np.random.default_rng(7)
    shifted = 0
    for _ in range(TRIALS):
        grad, mu = _int32s(rng, (n,)), int(rng.integers(1, 8))
        param = (rng.integers(-127, 128, n).astype(np.int8) if kind == "weight"
                 else _int32s(rng, (n,)))
        (got,) = kernels[f"update_{kind}_{n}"](param, grad, np.array([mu], np.float32))
        np.testing.assert_array_equal(got, niti_update(param, grad, mu))
        shifted += rounding.shift_for(grad, mu + (0 if kind == "weight" else 8)) > 0
    assert 0 < shifted < TRIALS


def test_micro_batch_gradients_add_at_the_coarser_exponent_as_numpy(kernels):
    """niti/micro_batches.py accumulate: sums and gradients of any int32 magnitude (below
    2^30 each, as two gradients of int8 products are) at exponents either way apart, gaps
    past SHIFT_LIMIT included, and from an EMPTY accumulator the gradient itself."""
    rng = np.random.default_rng(8)
    for trial in range(TRIALS):
        acc, grad = _int32s(rng, (N,)) >> 2, _int32s(rng, (N,)) >> 2
        e_acc, e_grad = _exponent(rng, -60, 20), _exponent(rng, -60, 20)
        if trial % 10 == 0:  # before the first micro-batch
            acc, e_acc = np.zeros(N, np.int32), np.array([micro_batches.EMPTY], np.int32)
        got, e = kernels["accumulate"](acc, e_acc, grad, e_grad)
        want, want_e = micro_batches.accumulate(acc, int(e_acc[0]), grad, int(e_grad[0]))
        np.testing.assert_array_equal(got, want)
        assert e[0] == want_e
        if e_acc[0] == micro_batches.EMPTY:
            np.testing.assert_array_equal(got, grad)
            assert e[0] == e_grad[0]


def _spread_int8s(rng, shape):
    """int8 values within +-spread, spread 0 (a constant channel) to 127."""
    spread = int(rng.integers(0, 128))
    return rng.integers(-spread, spread + 1, shape).astype(np.int8)


def test_batch_norm_normalizes_and_moves_its_statistics_as_numpy(kernels):
    """NITI's integer BatchNorm (niti/batch_norm.py): x_hat, the square root (integer Newton
    against math.isqrt) and the running statistics, over spreads from a constant channel to
    the whole int8 range and exponents far apart."""
    rng = np.random.default_rng(8)
    for _ in range(TRIALS):
        q = _spread_int8s(rng, (4, 3, 5, 6))
        e = _exponent(rng, -12, 4)
        e_mean, e_var = e - int(rng.integers(0, 12)), 2 * e - int(rng.integers(0, 12))
        mean, var = _int32s(rng, (3,)) >> 8, np.abs(_int32s(rng, (3,))) >> 8
        x_hat, r, g, new_mean, new_var = kernels["batch_norm_train"](
            q, mean, var, e, e_mean, e_var)
        want_x, (want_r, want_g) = batch_norm.normalize(q)
        np.testing.assert_array_equal(x_hat, want_x)
        np.testing.assert_array_equal(r, want_r)
        np.testing.assert_array_equal(g, want_g)
        want_mean, want_var = batch_norm.update_running(
            mean, var, int(e_mean[0]), int(e_var[0]), q, int(e[0]), 0.1)
        np.testing.assert_array_equal(new_mean, want_mean)
        np.testing.assert_array_equal(new_var, want_var)


def test_batch_norm_backward_as_numpy(kernels):
    rng = np.random.default_rng(9)
    for _ in range(TRIALS):
        q = _spread_int8s(rng, (4, 3, 5, 6))
        x_hat, (r, g) = batch_norm.normalize(q)
        d_hat = rng.integers(-127, 128, q.shape).astype(np.int8)
        (dx,) = kernels["batch_norm_backward"](d_hat, x_hat, r, g.astype(np.int32))
        want, _ = batch_norm.normalize_backward(d_hat, x_hat, (r, g), 0, 0)
        np.testing.assert_array_equal(dx, want)


def test_the_square_root_is_the_floor_at_every_bit_length(kernels):
    """Perfect squares, one below and above, and random values of every length to 2^62."""
    rng = np.random.default_rng(10)
    values = []
    for bits in range(1, 63):
        k = int(rng.integers(1 << (bits - 1), 1 << bits))
        values += [k, max(math.isqrt(k) ** 2 - 1, 0), math.isqrt(k) ** 2]
    r, g = kernels["root"](np.array(values, np.int64))
    assert all(int(x) == math.isqrt(int(v) << (2 * int(s))) for x, v, s in zip(r, values, g))
    want_r, want_g = batch_norm.root(np.array(values, np.int64))
    np.testing.assert_array_equal(r, want_r)
    np.testing.assert_array_equal(g, want_g)


def test_batch_norm_evaluates_with_the_running_statistics_as_numpy(kernels):
    rng = np.random.default_rng(11)
    for _ in range(TRIALS):
        q = _spread_int8s(rng, (4, 3, 5, 6))
        e = _exponent(rng, -12, 4)
        e_mean, e_var = e - int(rng.integers(-4, 12)), 2 * e - int(rng.integers(-4, 12))
        mean, var = _int32s(rng, (3,)) >> 8, np.abs(_int32s(rng, (3,))) >> 8
        (x_hat,) = kernels["batch_norm_eval"](q, e, mean, var, e_mean, e_var)
        want = batch_norm.normalize_running(q, int(e[0]), mean, var, int(e_mean[0]),
                                            int(e_var[0]))
        np.testing.assert_array_equal(x_hat, want)
