"""Generated projects built with -fsanitize=address,undefined run their steps with no report.

A plain C driver links the generated library (compiled with the sanitizers, aborting on the
first report), trains a few steps on deterministic data, predicts, and round-trips a
checkpoint through the file storage.
"""

import subprocess

import pytest
import torch
from torch import nn

import ubitrain as ub
from ubitrain.zoo import ZOO

DRIVER_C = r"""
#include <stdio.h>
#include "model.h"
#include "ub_storage_file.h"

static float arena[UB_M_ARENA_BYTES / 4 + 4];

int main(void) {
    static float x[UB_M_INPUT0_ELEMENTS], out[UB_M_OUTPUT_ELEMENTS];
    int32_t labels[UB_M_LABEL_ELEMENTS];
    ub_m_ctx ctx;
    if (ub_m_init(&ctx, arena, UB_M_ARENA_BYTES, 7) != UB_OK) return 1;
    for (int step = 0; step < 3; ++step) {
        for (int i = 0; i < UB_M_INPUT0_ELEMENTS; ++i)
            x[i] = (float)((i * 37 + step * 11) % 23) / 23.0f - 0.5f;
        for (int i = 0; i < UB_M_LABEL_ELEMENTS; ++i) labels[i] = (i + step) % 10;
        float loss;
        int32_t st = ub_m_train_step(&ctx, x, labels, &loss);
        if (st != UB_OK) { printf("step %d: status %d\n", step, st); return 1; }
    }
    if (ub_m_predict(&ctx, x, out) != UB_OK) return 1;
    ub_file_storage files;
    ub_storage storage;
    if (ub_file_storage_open(&files, &storage, "ckpt") != UB_OK) return 1;
    if (ub_m_save(&ctx, &storage) != UB_OK || ub_m_restore(&ctx, &storage) != UB_OK) return 1;
    printf("ok\n");
    return 0;
}
"""

HARNESS = """
cmake_minimum_required(VERSION 3.13)
project(sanitized C)
set(SAN -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_subdirectory({project} generated)
target_compile_options(ub_m PRIVATE ${{SAN}})
add_executable(driver main.c)
target_compile_options(driver PRIVATE ${{SAN}})
target_link_libraries(driver PRIVATE ub_m ${{SAN}})
"""


class DropoutCNN(nn.Module):
    """Conv, BN, ReLU6, max and average pooling, dropout, concat: many kernel shapes."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU6(),
                               nn.MaxPool2d(2))
        self.b = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.Hardswish(),
                               nn.AvgPool2d(2))
        self.head = nn.Sequential(nn.Dropout(0.25), nn.Linear(12 * 2 * 2, 10))

    def forward(self, x):
        y = self.a(x)
        y = torch.cat([self.b(y), nn.functional.avg_pool2d(y, 2)], 1)
        return self.head(torch.flatten(y, 1))


@pytest.mark.parametrize("name", ["dropout_cnn", "mlp_layernorm_gelu"])
def test_generated_step_is_clean_under_sanitizers(name, tmp_path):
    torch.manual_seed(0)
    if name == "dropout_cnn":
        model, shape = DropoutCNN(), (1, 8, 8)
    else:
        model, shape = ZOO[name].factory(), ZOO[name].sample_shape
    x, y = torch.randn(4, *shape), torch.randint(0, 10, (4,))
    project = tmp_path / "m"
    ub.compile(model, (x,), y, optimizer=ub.Adam(lr=1e-3), out_dir=project)
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "main.c").write_text(DRIVER_C)
    (harness / "CMakeLists.txt").write_text(HARNESS.format(project=project.as_posix()))
    for cmd in (["cmake", "-S", str(harness), "-B", str(tmp_path / "b"),
                 "-DCMAKE_BUILD_TYPE=Debug"],
                ["cmake", "--build", str(tmp_path / "b")]):
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
    run = subprocess.run([str(tmp_path / "b" / "driver")], capture_output=True, text=True,
                         cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
    assert "runtime error" not in run.stderr and "AddressSanitizer" not in run.stderr
