"""Cross builds: the generated project built with a target's toolchain file, its driver
program started under the target's emulator.

The toolchain files live in the repository's `targets/<name>/` (packaged as
`ubitrain/target_files`); every project compiled for a target carries a copy in its
`toolchains/`, which its build uses. On a board target the build reads the ELF's section sizes
(`arm-none-eabi-size`) and reports flash and SRAM use beside the board's sizes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import BuildError
from ..targets import Target
from .build import cmake_build
from .emulated_trainer import EmulatedTrainer

TARGET_FILES = Path(__file__).resolve().parent.parent / "target_files"
APT_PACKAGES = {
    "aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu", "qemu-aarch64": "qemu-user",
    "arm-none-eabi-gcc": "gcc-arm-none-eabi libnewlib-arm-none-eabi",
    "qemu-system-arm": "qemu-system-arm", "clang": "clang lld", "qemu-hexagon": "qemu-user",
    "ld.lld": "lld", "arm-none-eabi-size": "binutils-arm-none-eabi",
}


def missing_tools(target: Target) -> list[str]:
    tools = list(target.tools)
    if target.board is not None:
        tools.append("arm-none-eabi-size")
    if target.compiler == "clang":
        tools.append("ld.lld")
    return [t for t in tools if shutil.which(t) is None]


def toolchain_file(target: Target, project_dir: Path | None = None) -> Path:
    """The target's toolchain file: the copy a generated project carries in toolchains/,
    or without a project the one in ubitrain's targets/."""
    root = TARGET_FILES if project_dir is None else Path(project_dir) / "toolchains"
    path = root / target.toolchain_dir / "toolchain.cmake"
    if not path.is_file():
        raise BuildError(f"target {target.name}: no toolchain file at {path}"
                         + ("; compile the model for this target, which copies it into the "
                            "project" if project_dir is not None else ""))
    return path


def build_driver(project_dir: Path, model_name: str, target: Target,
                 progress: bool | None = None) -> Path:
    """Cross-compile the project and its driver program; the driver's path."""
    missing = missing_tools(target)
    if missing:
        packages = " ".join(dict.fromkeys(APT_PACKAGES.get(t, t) for t in missing))
        raise BuildError(f"target {target.name} needs {', '.join(missing)}, which is not "
                         f"installed; install it with: apt-get install {packages} (or run "
                         "scripts/setup.sh)")
    build_dir = cmake_build(project_dir, project_dir / f"build-{target.name}", shared=False,
                            extra_args=("-DUB_BUILD_DRIVER=ON",),
                            toolchain=toolchain_file(target, project_dir), progress=progress)
    binary = build_dir / f"ub_{model_name}_driver"
    if not binary.is_file():
        raise BuildError(f"the build produced no {binary.name} in {build_dir}")
    return binary


def device_memory(binary: Path, target: Target) -> dict:
    """Flash and SRAM of a board build, from the ELF's sections (arm-none-eabi-size)."""
    if target.board is None:
        return {}
    out = subprocess.run(["arm-none-eabi-size", "-B", str(binary)], capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1].split()
    text, data, bss = (int(v) for v in out[:3])
    board = target.board
    report = {"board": board.name, "flash_bytes": text + data, "flash_size": board.flash_bytes,
              "sram_static_bytes": data + bss, "stack_bytes": board.stack_bytes,
              "sram_bytes": data + bss + board.stack_bytes, "sram_size": board.sram_bytes}
    report["summary"] = (
        f"{board.name}: flash {report['flash_bytes']:,} of {board.flash_bytes:,} B "
        f"(code, initial weights, constants); SRAM {report['sram_bytes']:,} of "
        f"{board.sram_bytes:,} B (.data + .bss {data + bss:,} B with the arena, stack "
        f"{board.stack_bytes:,} B)")
    return report


def start_trainer(package, target: Target, seed: int = 0,
                  progress: bool | None = None) -> EmulatedTrainer:
    binary = build_driver(Path(package.out_dir), package.model_name, target, progress)
    memory = device_memory(binary, target)
    timeout = float(os.environ.get("UBITRAIN_EMULATOR_TIMEOUT", "600"))
    return EmulatedTrainer(target.emulator_command(str(binary.resolve())), package, seed=seed,
                           cwd=binary.parent, timeout=timeout, device_memory=memory)
