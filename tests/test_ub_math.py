"""runtime_c/ub_math.h (the inline expf, tanhf and erff the generated kernels call) against
float64 numpy / SciPy over a dense grid: error in ulp of the true value, NaN propagation and
the limits; built with the host compiler at -O3, as the kernels are, where the loops over
them must vectorize."""

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = r"""
#include <stdio.h>
#include "ub_math.h"
enum { N = 200001 };
static float x[N], e[N], t[N], f[N];
int main(void) {
    for (int i = 0; i < N; ++i) x[i] = fread(&x[i], 4, 1, stdin) == 1 ? x[i] : 0.0f;
    for (int i = 0; i < N; ++i) e[i] = ub_expf(x[i]);  /* three loops the compiler vectorizes */
    for (int i = 0; i < N; ++i) t[i] = ub_tanhf(x[i]);
    for (int i = 0; i < N; ++i) f[i] = ub_erff(x[i]);
    fwrite(e, 4, N, stdout); fwrite(t, 4, N, stdout); fwrite(f, 4, N, stdout);
    return 0;
}
"""
N = 200001


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the float32 spacing at want."""
    spacing = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


@pytest.fixture(scope="module")
def evaluate(tmp_path_factory):
    exe = tmp_path_factory.mktemp("ub_math") / "ub_math"
    src = exe.with_suffix(".c")
    src.write_text(PROGRAM)
    cc = shutil.which("gcc") or "cc"
    build = subprocess.run([cc, "-O3", "-march=native", "-std=c99",
                            "-Wall", "-Werror", "-fopt-info-vec-optimized",
                            "-I", str(ROOT / "runtime_c"), str(src), "-o", str(exe), "-lm"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    # the point of ub_math.h: the loops over expf, tanhf and erff vectorize (lines 8-10)
    vectorized = {int(line.split(":")[1]) for line in build.stderr.splitlines()
                  if "loop vectorized" in line}
    assert {8, 9, 10} <= vectorized, build.stderr

    def run(xs: np.ndarray):
        xs = np.resize(xs.astype(np.float32), N)
        out = subprocess.run([str(exe)], input=xs.tobytes(), capture_output=True, check=True)
        return xs, np.frombuffer(out.stdout, np.float32).reshape(3, N)
    return run


def test_expf_within_two_ulp(evaluate):
    x, (e, _, _) = evaluate(np.linspace(-87.3, 88.7, N))
    assert ulp_error(e, np.exp(x.astype(np.float64))).max() <= 2.0


def test_expf_underflows_as_float32_does(evaluate):
    """Below e^-87.3 (FLT_MIN) IEEE float32 gives denormals, then 0 below e^-103.9, and inf
    above e^88.72: what PyTorch computes, so a gradient through a vanishing softmax weight
    vanishes alike."""
    x, (e, _, _) = evaluate(np.linspace(-110, -87, N))
    assert ulp_error(e, np.exp(x.astype(np.float64))).max() <= 1.0
    assert (e[x < -104] == 0).all() and (e[x > -103] > 0).all()
    x, (e, _, _) = evaluate(np.linspace(88.7, 95, N))
    want, top = np.exp(x.astype(np.float64)), float(np.finfo(np.float32).max)
    assert ulp_error(e[want < 0.9999 * top], want[want < 0.9999 * top]).max() <= 2.0
    assert (e[want > 1.0001 * top] == np.inf).all()


def test_tanhf_within_two_ulp(evaluate):
    x, (_, t, _) = evaluate(np.concatenate([np.linspace(-12, 12, N // 2),
                                            np.geomspace(1e-30, 1, N // 2)]))
    assert ulp_error(t, np.tanh(x.astype(np.float64))).max() <= 2.0


def test_erff_within_three_ulp(evaluate):
    x, (_, _, f) = evaluate(np.concatenate([np.linspace(-6, 6, N // 2),
                                            -np.geomspace(1e-30, 1, N // 2)]))
    assert ulp_error(f, erf(x.astype(np.float64))).max() <= 3.0


def test_limits_and_nan(evaluate):
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -100.0, 100.0], np.float32)
    x, (e, t, f) = evaluate(special)
    k = len(special)
    assert np.isnan(e[0]) and np.isnan(t[0]) and np.isnan(f[0])
    np.testing.assert_array_equal(t[1:5], [1, -1, 0, -0.0])
    np.testing.assert_array_equal(f[1:5], [1, -1, 0, -0.0])
    assert e[3] == 1 and e[4] == 1 and e[1] == np.inf and e[2] == 0
    assert e[5] == np.float32(np.exp(-100.0)) and e[6] == np.inf  # a denormal, rounded
    assert np.all(x[:k][1:] == special[1:])
