"""runtime_c's UB_FMIN / UB_FMAX (ReLU, ReLU6/clamp, max-pool in the printed kernels) and
their forms against a constant bound (ub_fmin_k_f32 / ub_fmax_k_f32 in float32, the macros
UB_FMIN_K / UB_FMAX_K otherwise) give PyTorch's values, NaN included, also when -O3
vectorises the loop that uses them; an in-place ReLU over an add vectorises on AArch64."""

import shutil
import subprocess

import numpy as np
import pytest
import torch

from ubitrain.project.emit import RUNTIME_C

PROGRAM = r"""
#include <stdio.h>
#include "ub_runtime.h"
#define N 4096
static float x[N], y[N];
int main(void) {
    if (fread(x, sizeof x, 1, stdin) != 1) return 2;
    for (int i = 0; i < N; ++i) y[i] = RELU6(x[i]);
    fwrite(y, sizeof y, 1, stdout);
    return 0;
}
"""


@pytest.mark.parametrize("relu6", ["UB_FMAX(UB_FMIN(v, 6.0f), 0.0f)",
                                   "UB_FMAX_K(UB_FMIN_K(v, 6.0f), 0.0f)",
                                   "ub_fmax_k_f32(ub_fmin_k_f32(v, 6.0f), 0.0f)"])
def test_clamp_of_the_runtime_matches_pytorch_with_nan_and_inf(tmp_path, relu6):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    (tmp_path / "main.c").write_text(f"#define RELU6(v) {relu6}\n" + PROGRAM)
    subprocess.run(["cc", "-O3", "-std=c99", f"-I{RUNTIME_C}", str(tmp_path / "main.c"),
                    "-o", str(tmp_path / "clamp")], check=True, capture_output=True)
    rng = np.random.default_rng(0)
    x = rng.uniform(-10, 10, 4096).astype(np.float32)
    x[rng.choice(4096, 200, replace=False)] = np.nan
    x[:4] = [np.inf, -np.inf, -0.0, 6.0]
    out = subprocess.run([str(tmp_path / "clamp")], input=x.tobytes(), capture_output=True,
                         check=True).stdout
    got = np.frombuffer(out, np.float32)
    want = torch.clamp(torch.from_numpy(x), 0.0, 6.0).numpy()
    assert np.array_equal(got, want, equal_nan=True)  # -0.0 == 0.0: see ub_runtime.h


def test_printer_uses_the_one_compare_form_only_against_a_constant_bound():
    from tvm import te

    from ubitrain.kernels.library import KernelLibrary

    x = te.placeholder((64,), name="x")
    z = te.placeholder((64,), name="z")
    relu6 = te.compute((64,), lambda i: te.max(te.min(x[i], 6.0), 0.0), name="y")
    pair = te.compute((64,), lambda i: te.min(x[i], z[i]), name="y")
    relu6_c = KernelLibrary("scalar").add(te.create_prim_func([x, relu6]), "relu6").source
    pair_c = KernelLibrary("scalar").add(te.create_prim_func([x, z, pair]), "pair").source
    assert "ub_fmax_k_f32(ub_fmin_k_f32(" in relu6_c and "UB_FMIN(" not in relu6_c
    assert "UB_FMIN(" in pair_c and "_k_f32(" not in pair_c  # z may be NaN: both tests


def test_in_place_relu_of_an_add_vectorises_on_aarch64(tmp_path):
    """A per-channel add and ReLU written over its input (digits_cnn's second conv: planes
    of 4x4): with UB_FMAX_K's ?:, which reads x twice, GCC 12 -O3 threaded the loop into
    branches on AArch64 and ran it one element at a time."""
    from harness import require_tools
    from tvm import te

    from ubitrain.kernels.library import KernelLibrary

    require_tools("aarch64-neon")
    x = te.placeholder((2, 16, 4, 4), name="x")
    b = te.placeholder((16,), name="b")
    y = te.compute(x.shape, lambda n, c, h, w: te.max(x[n, c, h, w] + b[c], 0.0), name="y")
    library = KernelLibrary("neon")
    kernel = library.add(te.create_prim_func([x, b, y]), "add_relu")
    variant = library.in_place_variant(kernel.name, {0: 2})
    assert "read through" in variant.source  # the in-place variant: x through y's pointer
    (tmp_path / "k.c").write_text(f'#include "ub_runtime.h"\n{variant.source}\n'
                                  f"void *ub_keep = (void *){variant.name};\n")
    build = subprocess.run(["aarch64-linux-gnu-gcc", "-O3", "-march=armv8-a", "-std=gnu99",
                            "-fno-math-errno", f"-I{RUNTIME_C}", "-fopt-info-vec-optimized",
                            "-c", str(tmp_path / "k.c"), "-o", str(tmp_path / "k.o")],
                           capture_output=True, text=True, check=True)
    assert "vectorized" in build.stderr, build.stderr
