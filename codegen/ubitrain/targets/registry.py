"""The targets ubitrain can compile for, each described in one place.

A target names its compiler (a CMake toolchain file under the repository's `targets/<dir>/`),
its vector width, the memory of its board, the kernel variants it uses and the command that
runs a binary of it under an emulator. `ubitrain targets` prints this table.

Accumulators: reductions (BatchNorm statistics, sums, means) accumulate in float64 where the
target has a double-precision FPU, as PyTorch does on a CPU. The Cortex-M4F's FPU
(fpv4-sp-d16) is single precision only, so float64 there would be software emulation:
cortex-m4 accumulates in float32. The Cortex-M7 of mps2-an500 has the double-precision
FPU (fpv5-d16; QEMU models it with double support), so cortex-m7 keeps float64. Hexagon
v66 has double-precision add/subtract but no double multiply (that came with v67), and the
freestanding build has no compiler-rt to emulate it: hexagon-v66 accumulates in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CompileError
from . import cost_profiles
from .cost_profiles import CostProfile

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Board:
    """A board's memories: code and constants in flash, the arena and the stack in SRAM."""

    name: str
    flash_bytes: int
    sram_bytes: int
    stack_bytes: int  # reserved by the linker script below the top of SRAM


@dataclass(frozen=True)
class Target:
    """Everything the compiler asks of a target: nothing else keeps a table of targets or
    compares target names."""

    name: str
    description: str
    # the micro-kernel ISA token per dtype of the kernels' operands (scalar, avx2, neon,
    # cmsis_dsp, hvx): float32 and int8 kernels use different instructions of a machine
    isas: tuple[tuple[str, str], ...]
    alignment: int  # arena and buffer alignment in bytes
    runs_on_host: bool
    cost: CostProfile  # what kernels, calls and pages cost here (the budget's objective)
    accumulate_dtype: str = "float64"  # reductions' accumulator; float32 without a DP FPU
    cmake_args: tuple[str, ...] = ()
    vector_bytes: int = 0  # SIMD register width the kernels may use (0: none)
    toolchain_dir: str | None = None  # folder under targets/ with toolchain.cmake
    toolchain_shared: tuple[str, ...] = ()  # other folders under targets/ that it includes
    compiler: str | None = None  # the executable the toolchain file uses
    compile_flags: str = ""  # what the toolchain file passes (for the listing and README)
    emulator: tuple[str, ...] = ()  # the command that runs a driver binary: "{binary}" replaced
    driver_io: str = "stdio"  # how the driver reads commands: stdio, semihosting, syscall
    board: Board | None = None
    kernel_variants: tuple[str, ...] = ("scalar",)
    # State no step writes (frozen weights) as `const` data in flash instead of the arena in
    # SRAM (program/frozen_state.py); where flash and SRAM are distinct memories.
    frozen_state_in_flash: bool = False
    # A DSP (Hexagon): int8 kernels are placed on it, or on a CPU where it cannot run them,
    # and NITI(dsp_offload=True) splits the step between the two (offload/placement.py).
    dsp: bool = False

    def kernel_isa(self, dtype: str = "float32") -> str:
        """The micro-kernel ISA for kernels over `dtype` ("scalar" where none is faster)."""
        return dict(self.isas).get(dtype, "scalar")

    @property
    def toolchain_dirs(self) -> tuple[str, ...]:
        """The folders under targets/ a cross build reads (copied into every project)."""
        return ((self.toolchain_dir,) if self.toolchain_dir else ()) + self.toolchain_shared

    def emulator_command(self, binary: str) -> list[str]:
        return [part.replace("{binary}", binary) for part in self.emulator]

    @property
    def tools(self) -> list[str]:
        """The executables a build and a run for this target need."""
        tools = [t for t in (self.compiler,) if t]
        if self.emulator:
            tools.append(self.emulator[0])
        return tools


ARM_EABI_EMULATOR = ("-nographic", "-monitor", "none", "-serial", "none",
                     "-semihosting-config", "enable=on,target=native", "-kernel", "{binary}")
MPS2_STACK = 64 * KiB
CORTEX_M_ISAS = (("float32", "cmsis_dsp"), ("int8", "cmsis_dsp"))

TARGETS = {
    t.name: t
    for t in (
        Target("host", "this machine's C compiler (C99; conv and matmul on AVX2+FMA "
               "micro-kernels where the x86-64 processor has them, plain C otherwise)",
               (("float32", "avx2"), ("int8", "scalar")), 16, True, cost_profiles.HOST,
               kernel_variants=("avx2", "scalar")),
        Target("aarch64-neon", "AArch64 + NEON, the Android arm64-v8a ISA (the NDK builds the "
               "same project)",
               (("float32", "neon"), ("int8", "neon")), 16, False, cost_profiles.PHONE_CPU,
               vector_bytes=16, toolchain_dir="aarch64-neon",
               compiler="aarch64-linux-gnu-gcc", compile_flags="-O2 -march=armv8-a",
               emulator=("qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", "{binary}"),
               kernel_variants=("neon", "scalar")),
        Target("cortex-m4", "Cortex-M4F (single-precision FPU) on the mps2-an386 board",
               CORTEX_M_ISAS, 8, False, cost_profiles.CORTEX_M4, accumulate_dtype="float32",
               vector_bytes=4, toolchain_dir="cortex-m4", toolchain_shared=("arm-none-eabi",),
               compiler="arm-none-eabi-gcc",
               compile_flags="-mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16 "
                             "--specs=rdimon.specs",
               emulator=("qemu-system-arm", "-M", "mps2-an386", *ARM_EABI_EMULATOR),
               driver_io="semihosting", board=Board("mps2-an386", 4 * MiB, 4 * MiB, MPS2_STACK),
               kernel_variants=("cmsis_dsp", "scalar"), frozen_state_in_flash=True),
        Target("cortex-m7", "Cortex-M7 (double-precision FPU) on the mps2-an500 board",
               CORTEX_M_ISAS, 8, False, cost_profiles.CORTEX_M7, accumulate_dtype="float64",
               vector_bytes=4, toolchain_dir="cortex-m7", toolchain_shared=("arm-none-eabi",),
               compiler="arm-none-eabi-gcc",
               compile_flags="-mcpu=cortex-m7 -mthumb -mfloat-abi=hard -mfpu=fpv5-d16 "
                             "--specs=rdimon.specs",
               emulator=("qemu-system-arm", "-M", "mps2-an500", *ARM_EABI_EMULATOR),
               driver_io="semihosting", board=Board("mps2-an500", 4 * MiB, 4 * MiB, MPS2_STACK),
               kernel_variants=("cmsis_dsp", "scalar"), frozen_state_in_flash=True),
        Target("hexagon-v66", "Hexagon v66 DSP (HVX 128 B), freestanding: ubitrain's own start "
               "code, syscalls and libm", (("float32", "scalar"), ("int8", "hvx")), 128, False,
               cost_profiles.HEXAGON, accumulate_dtype="float32", vector_bytes=128,
               toolchain_dir="hexagon-v66", compiler="clang", dsp=True,
               compile_flags="--target=hexagon-unknown-linux-musl -mcpu=hexagonv66 -O2 "
                             "-ffreestanding -nostdlib -static -fuse-ld=lld",
               emulator=("qemu-hexagon", "{binary}"), driver_io="syscall"),
    )
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise CompileError(f"unknown target {name!r}; available targets: "
                           f"{', '.join(TARGETS)}") from None
