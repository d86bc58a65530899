"""runtime_c's UB_FMIN / UB_FMAX (ReLU, ReLU6/clamp, max-pool in the printed kernels) give
PyTorch's values, NaN included, also when -O3 vectorises the loop that uses them."""

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
    for (int i = 0; i < N; ++i) y[i] = UB_FMAX(UB_FMIN(x[i], 6.0f), 0.0f);  /* relu6 */
    fwrite(y, sizeof y, 1, stdout);
    return 0;
}
"""


def test_clamp_of_the_runtime_matches_pytorch_with_nan_and_inf(tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    (tmp_path / "main.c").write_text(PROGRAM)
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
    assert np.array_equal(got, want, equal_nan=True)
