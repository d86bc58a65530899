"""The generated C on its own: built by CMake from a plain C program, no Python in the loop.

It checks arguments and returns status codes: NULL pointers, a short or misaligned arena, an
uninitialised context, out-of-range labels, a non-finite loss (nothing updated), bad tensor
indices and sizes; and a normal step returns UB_OK with a finite loss.
"""

import gc
import subprocess
import weakref

import numpy as np
import torch
from harness import assert_trains_like_torch
from torch import nn

import ubitrain as ub

MAIN_C = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "model.h"

#define CHECK(cond) \
    do { if (!(cond)) { printf("FAILED line %d: %s\n", __LINE__, #cond); return 1; } } while (0)

static float arena_store[UB_CAPI_ARENA_BYTES / 4 + 16];

int main(void) {
    uint8_t *arena = (uint8_t *)arena_store;
    ub_capi_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    float x[UB_CAPI_INPUT0_ELEMENTS], loss = 0.0f, out[UB_CAPI_OUTPUT_ELEMENTS];
    int32_t labels[UB_CAPI_LABEL_ELEMENTS] = {0, 1, 2, 1};
    for (int i = 0; i < UB_CAPI_INPUT0_ELEMENTS; ++i) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;

    CHECK(ub_capi_train_step(&ctx, x, labels, &loss) == UB_ERR_NOT_INITIALIZED);
    CHECK(ub_capi_init(NULL, arena, UB_CAPI_ARENA_BYTES, 1) == UB_ERR_NULL_ARGUMENT);
    CHECK(ub_capi_init(&ctx, NULL, UB_CAPI_ARENA_BYTES, 1) == UB_ERR_NULL_ARGUMENT);
    CHECK(ub_capi_init(&ctx, arena, UB_CAPI_ARENA_BYTES - 1, 1) == UB_ERR_ARENA_TOO_SMALL);
    CHECK(ub_capi_init(&ctx, arena + 1, UB_CAPI_ARENA_BYTES, 1) == UB_ERR_ARENA_ALIGNMENT);
    CHECK(ub_capi_init(&ctx, arena, UB_CAPI_ARENA_BYTES, 1) == UB_OK);

    CHECK(ub_capi_train_step(&ctx, NULL, labels, &loss) == UB_ERR_NULL_ARGUMENT);
    CHECK(ub_capi_train_step(&ctx, x, NULL, &loss) == UB_ERR_NULL_ARGUMENT);
    CHECK(ub_capi_train_step(&ctx, x, labels, NULL) == UB_ERR_NULL_ARGUMENT);
    labels[2] = 3;
    CHECK(ub_capi_train_step(&ctx, x, labels, &loss) == UB_ERR_LABEL_RANGE);
    labels[2] = -1;
    CHECK(ub_capi_train_step(&ctx, x, labels, &loss) == UB_ERR_LABEL_RANGE);
    labels[2] = 2;

    /* A non-finite loss changes nothing: the first weight stays as it was. */
    float w_before[48], w_after[48];
    const ub_capi_tensor_info *w = ub_capi_tensor_info_at(0);
    CHECK(w != NULL && w->bytes == sizeof w_before);
    CHECK(ub_capi_get_tensor(&ctx, 0, w_before, sizeof w_before) == UB_OK);
    x[0] = INFINITY;
    CHECK(ub_capi_train_step(&ctx, x, labels, &loss) == UB_ERR_NONFINITE_LOSS);
    CHECK(ub_capi_get_tensor(&ctx, 0, w_after, sizeof w_after) == UB_OK);
    CHECK(memcmp(w_before, w_after, sizeof w_before) == 0);
    CHECK(ctx.step == 0);
    x[0] = 0.25f;

    CHECK(ub_capi_train_step(&ctx, x, labels, &loss) == UB_OK);
    CHECK(isfinite(loss) && loss > 0.0f);
    CHECK(ctx.step == 1);
    CHECK(ub_capi_get_tensor(&ctx, 0, w_after, sizeof w_after) == UB_OK);
    CHECK(memcmp(w_before, w_after, sizeof w_before) != 0);
    CHECK(ub_capi_predict(&ctx, x, out) == UB_OK);
    CHECK(ub_capi_predict(&ctx, x, NULL) == UB_ERR_NULL_ARGUMENT);

    CHECK(ub_capi_tensor_info_at(UB_CAPI_TENSOR_COUNT) == NULL);
    CHECK(ub_capi_get_tensor(&ctx, UB_CAPI_TENSOR_COUNT, w_after, sizeof w_after) == UB_ERR_INDEX);
    CHECK(ub_capi_get_tensor(&ctx, 0, w_after, sizeof w_after - 4) == UB_ERR_SIZE);
    CHECK(ub_capi_set_tensor(&ctx, 0, NULL, sizeof w_after) == UB_ERR_NULL_ARGUMENT);
    printf("ok\n");
    return 0;
}
"""

HARNESS_CMAKE = """
cmake_minimum_required(VERSION 3.13)
project(capi_check C)
add_subdirectory({project} generated)
add_executable(check main.c)
target_link_libraries(check PRIVATE ub_capi)
"""


def test_generated_c_checks_arguments_and_returns_status(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 1])
    project = tmp_path / "capi"
    ub.compile(model, (x,), y, optimizer=ub.SGD(lr=0.1, momentum=0.9), out_dir=project)

    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "main.c").write_text(MAIN_C)
    (harness / "CMakeLists.txt").write_text(HARNESS_CMAKE.format(project=project.as_posix()))
    build = tmp_path / "b"
    for cmd in (["cmake", "-S", str(harness), "-B", str(build)],
                ["cmake", "--build", str(build)]):
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    run = subprocess.run([str(build / "check")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr


def test_bound_step_trains_as_step_and_pytorch(tmp_path):
    """trainer.bound_step(x, y) (checked once, then the bare C call that benchmarks/speed.py
    times) updates the parameters exactly as trainer.step does, which trains like PyTorch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 1])
    checked = assert_trains_like_torch(model, [(x, y)] * 3, ub.SGD(lr=0.1, momentum=0.9),
                                       tmp_path / "m")
    bound = checked.package.build()
    step = bound.bound_step(x.numpy(), y.numpy())
    for _, params, optimizer_state in checked.verdict.trajectory:
        assert step() == 0
        for got, want in ((bound.parameters(), params),
                          (bound.optimizer_state(), optimizer_state)):
            assert got.keys() == want.keys()
            for name in want:
                assert np.array_equal(got[name], want[name]), name
    assert bound.steps == 3


def test_bound_step_keeps_its_trainer_alive(tmp_path):
    """A bound step outliving every other reference to its trainer still owns the arena
    and library its bare pointers refer to (they were freed under it once: heap corruption)."""
    model = nn.Sequential(nn.Linear(6, 3))
    x, y = torch.randn(4, 6), torch.tensor([0, 1, 2, 1])
    trainer = ub.compile(model, (x,), y, out_dir=tmp_path / "m").build()
    alive = weakref.ref(trainer)
    step = trainer.bound_step(x.numpy(), y.numpy())
    del trainer
    gc.collect()
    assert alive() is not None
    assert step() == 0 and alive().steps == 1
