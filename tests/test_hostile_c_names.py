"""C names: two generated models include and link in one program, and a name that would
redeclare the runtime's is refused."""


import numpy as np
import pytest
import torch
from torch import nn

import ubitrain as ub

TWO_MODELS_C = r"""
#include <stdio.h>
#include "first/model.h"
#include "checkpoint/model.h"

#define ALIGNED __attribute__((aligned(16)))
static uint8_t arena_a[UB_FIRST_ARENA_BYTES] ALIGNED;
static uint8_t arena_b[UB_CHECKPOINT_MODEL_ARENA_BYTES] ALIGNED;

static void fill(float *x, int n, int32_t *labels, int batch) {
    for (int i = 0; i < n; ++i) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < batch; ++i) labels[i] = i % 3;
}

int main(void) {
    ub_first_ctx a;
    ub_checkpoint_model_ctx b;
    float xa[UB_FIRST_INPUT0_ELEMENTS], xb[UB_CHECKPOINT_MODEL_INPUT0_ELEMENTS], la, lb;
    int32_t ya[UB_FIRST_LABEL_ELEMENTS], yb[UB_CHECKPOINT_MODEL_LABEL_ELEMENTS];
    ub_first_dtype dtype = UB_F32;
    fill(xa, UB_FIRST_INPUT0_ELEMENTS, ya, UB_FIRST_BATCH);
    fill(xb, UB_CHECKPOINT_MODEL_INPUT0_ELEMENTS, yb, UB_CHECKPOINT_MODEL_BATCH);
    if (ub_first_init(&a, arena_a, sizeof arena_a, 1) != UB_OK ||
        ub_checkpoint_model_init(&b, arena_b, sizeof arena_b, 1) != UB_OK ||
        ub_first_train_step(&a, xa, ya, &la) != UB_OK ||
        ub_checkpoint_model_train_step(&b, xb, yb, &lb) != UB_OK) return 1;
    printf("%.9g %.9g %d\n", la, lb, (int)dtype);
    return 0;
}
"""

TWO_MODELS_CMAKE = """
cmake_minimum_required(VERSION 3.13)
project(two_models C)
add_subdirectory({first} first_build)
add_subdirectory({second} second_build)
add_executable(two main.c)
target_include_directories(two PRIVATE {root})
target_link_libraries(two PRIVATE ub_first ub_checkpoint_model)
"""


def _c_inputs(shape, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """TWO_MODELS_C's batch."""
    n = int(np.prod(shape))
    x = torch.tensor([((i * 7) % 11) / 11.0 - 0.5 for i in range(n)], dtype=torch.float32)
    return x.reshape(shape), torch.arange(batch) % 3


def test_two_generated_models_include_and_link_in_one_program(tmp_path):
    """Before: an out_dir named `checkpoint` gave `ub_checkpoint_save`, the runtime's own, and
    did not build; two model.h in one C file redeclared UB_F32 and UB_PARAMETER. Each model's
    first loss in the one program is PyTorch's."""
    import subprocess

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                        nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    xa, ya = _c_inputs((4, 3, 2, 2), 4)
    xb, yb = _c_inputs((2, 1, 6, 6), 2)
    ub.compile(mlp, (xa,), ya, out_dir=tmp_path / "first")
    with pytest.warns(ub.UbitrainWarning, match=r"out_dir 'checkpoint' would give the C prefix "
                                                r"ub_checkpoint_, which would declare "
                                                r"ub_checkpoint_restore .* the prefix is "
                                                r"ub_checkpoint_model_"):
        pkg = ub.compile(cnn, (xb,), yb, out_dir=tmp_path / "checkpoint")
    assert pkg.model_name == "checkpoint_model"
    (tmp_path / "main.c").write_text(TWO_MODELS_C)
    (tmp_path / "CMakeLists.txt").write_text(TWO_MODELS_CMAKE.format(
        first=(tmp_path / "first").as_posix(), second=(tmp_path / "checkpoint").as_posix(),
        root=tmp_path.as_posix()))
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(tmp_path), "-B", str(build)],
                ["cmake", "--build", str(build)]):
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = subprocess.run([str(build / "two")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    got = [float(v) for v in run.stdout.split()]
    with torch.no_grad():
        want = [nn.functional.cross_entropy(mlp(xa), ya).item(),
                nn.functional.cross_entropy(cnn(xb), yb).item()]
    np.testing.assert_allclose(got[:2], want, rtol=1e-5)
    assert got[2] == 0  # UB_F32


def test_a_name_that_would_redeclare_the_runtimes_names_is_refused(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    with pytest.raises(ub.CompileError, match=r"name='check' gives the C prefix ub_check_, "
                                              r"which would declare ub_check_ctx of ubitrain's "
                                              r"own C again; choose another name"):
        ub.compile(model, (torch.randn(4, 3, 2, 2),), torch.randint(0, 3, (4,)),
                   out_dir=tmp_path, name="check")
