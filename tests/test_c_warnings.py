"""The generated C compiles warning-free under -Wall -Wextra -Werror with every toolchain: gcc
and clang on the host, aarch64-linux-gnu-gcc, arm-none-eabi-gcc (Cortex-M4 and M7) and clang
for Hexagon, each through the project's own CMake build (UB_WERROR=ON), driver included."""

import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from harness import skip_or_fail
from torch import nn

import ubitrain as ub
from ubitrain.runtime.target_build import toolchain_file
from ubitrain.targets import get_target
from ubitrain.zoo import ZOO


class OpMix(nn.Module):
    """The kernels the zoo does not use: fused ELU, uneven adaptive pools, 1-D pools, split
    and slice copies, softmax, batched matmul, fills."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 9 + 8 * 3, 10)

    def forward(self, x):
        z = F.elu(self.conv(x))
        a, b = z.chunk(2, dim=1)
        z = torch.cat([F.leaky_relu(a[..., :7], 0.1), F.hardsigmoid(b[:, :, ::1, 1:])], 1)
        z = F.adaptive_max_pool2d(z, 3) + F.adaptive_avg_pool2d(z, 3)
        rows = z.flatten(2)
        attention = torch.softmax(rows @ rows.transpose(1, 2), -1)
        mixed = (attention @ rows).flatten(1)
        pooled = F.max_pool1d(rows, 3).flatten(1) + torch.zeros_like(rows[:, :, :3].flatten(1))
        return self.fc(torch.cat([mixed, pooled], 1))


LOCAL_MODELS = {"op_mix": (OpMix, (3, 8, 8), 10)}  # name: (factory, sample shape, classes)
MODELS = ["mobilenetv2_small", "mlp_layernorm_gelu", "lenet5", "digits_cnn_niti", "op_mix"]
TOOLCHAINS = {  # name: (target, C compiler for a host build, tool that must exist)
    "gcc": ("host", "gcc", "gcc"),
    "clang": ("host", "clang", "clang"),
    "aarch64": ("aarch64-neon", None, "aarch64-linux-gnu-gcc"),
    "cortex-m4": ("cortex-m4", None, "arm-none-eabi-gcc"),
    "cortex-m7": ("cortex-m7", None, "arm-none-eabi-gcc"),
    "hexagon": ("hexagon-v66", None, "clang"),
}


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    """Each model compiled once per target."""
    cache = {}

    def project(model, target):
        if (model, target) not in cache:
            factory, sample_shape, classes = LOCAL_MODELS.get(model) or (
                ZOO[model].factory, ZOO[model].sample_shape, ZOO[model].classes)
            torch.manual_seed(0)
            x = torch.randn(2, *sample_shape)
            y = torch.randint(0, classes, (2,))
            precision = "int8" if model.endswith("_niti") else "fp32"
            out = tmp_path_factory.mktemp(f"{model}_{target}")
            cache[model, target] = ub.compile(factory(), (x,), y, target=target,
                                              precision=precision, out_dir=out / "p").out_dir
        return cache[model, target]
    return project


@pytest.mark.parametrize("toolchain", list(TOOLCHAINS))
@pytest.mark.parametrize("model", MODELS)
def test_generated_c_builds_with_werror(model, toolchain, projects, tmp_path):
    target, compiler, tool = TOOLCHAINS[toolchain]
    if shutil.which(tool) is None:  # CI must check every toolchain
        skip_or_fail(f"{tool} is not installed (bash scripts/setup.sh installs it)")
    project = projects(model, target)
    args = ["cmake", "-S", str(project), "-B", str(tmp_path / "b"), "-DUB_WERROR=ON"]
    if compiler is not None:
        args.append(f"-DCMAKE_C_COMPILER={compiler}")
    else:
        args += [f"-DCMAKE_TOOLCHAIN_FILE={toolchain_file(get_target(target))}",
                 "-DUB_BUILD_DRIVER=ON"]
    configure = subprocess.run(args, capture_output=True, text=True)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    build = subprocess.run(["cmake", "--build", str(tmp_path / "b"), "-j", "2"],
                           capture_output=True, text=True)
    assert build.returncode == 0, (build.stdout + build.stderr)[-6000:]
    assert "warning" not in (build.stdout + build.stderr).lower()
