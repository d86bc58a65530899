"""The ISA variants of the int8 inner loops (templates/niti_simd.c.j2), and a check program
that runs each variant beside the scalar one on the target (or its emulator).

Integer sums are exact in any order, so a variant must equal the scalar loop bit for bit;
the check covers lengths around every vector width and the int8 extremes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import BuildError
from ..runtime.build import cmake_build
from ..targets import Target
from .program import ENV

# The variant each target uses: intrinsics where the ISA has an int8 dot product.
TARGET_ISA = {"host": "scalar", "aarch64-neon": "neon", "cortex-m4": "cmsis_dsp",
              "cortex-m7": "cmsis_dsp", "hexagon-v66": "hvx"}


def isa_for(target: Target) -> str:
    return TARGET_ISA.get(target.name, "scalar")


def render_simd(isa: str, prefix: str = "ub_niti_") -> str:
    return ENV.get_template("niti_simd.c.j2").render(isa=isa, prefix=prefix)


CHECK_MAIN = r"""
static uint32_t check_state = 12345u;
static int8_t check_next(void) {  /* LCG bytes, every value of int8 including -128 */
    check_state = check_state * 1664525u + 1013904223u;
    return (int8_t)(check_state >> 24);
}

int main(void) {
    static int8_t a[1100], b[1100];
    static int32_t acc_ref[1100], acc_isa[1100];
    static const uint32_t lengths[] = {0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 127,
                                       128, 129, 255, 256, 257, 300, 1024, 1100};
    for (uint32_t t = 0; t < sizeof lengths / sizeof lengths[0]; ++t) {
        const uint32_t n = lengths[t];
        for (uint32_t i = 0; i < n; ++i) {
            a[i] = check_next();
            b[i] = t % 3 == 0 ? (int8_t)(i % 2 ? -128 : 127) : check_next();
            acc_ref[i] = acc_isa[i] = (int32_t)check_next() * 1000;
        }
        if (ref_dot_s8(a, b, n) != isa_dot_s8(a, b, n)) return 10 + (int)t;
        const int32_t alpha = t % 2 ? -127 : (int32_t)check_next();
        ref_axpy_s8(acc_ref, alpha, a, n);
        isa_axpy_s8(acc_isa, alpha, a, n);
        for (uint32_t i = 0; i < n; ++i)
            if (acc_ref[i] != acc_isa[i]) return 50 + (int)t;
    }
    return 0;
}
"""

CHECK_CMAKE = """cmake_minimum_required(VERSION 3.13)
project(ub_simd_check C)
set(CMAKE_C_STANDARD 99)
add_executable(ub_simd_check check.c ${UB_TARGET_SOURCES})
if(UB_TARGET_INCLUDES)
  target_include_directories(ub_simd_check PRIVATE ${UB_TARGET_INCLUDES})
endif()
if(UB_TARGET_LIBS)
  target_link_libraries(ub_simd_check PRIVATE ${UB_TARGET_LIBS})
endif()
target_compile_options(ub_simd_check PRIVATE -O2 -Wall)
"""


def build_check(target: Target, isa: str, work: Path, toolchain: Path | None) -> Path:
    """The check program of `isa` against scalar, built for `target`."""
    work.mkdir(parents=True, exist_ok=True)
    source = ("#include <stdint.h>\n#include <string.h>\n" + render_simd("scalar", "ref_")
              + render_simd(isa, "isa_") + CHECK_MAIN)
    (work / "check.c").write_text(source)
    (work / "CMakeLists.txt").write_text(CHECK_CMAKE)
    build = cmake_build(work, work / "build", shared=False, toolchain=toolchain)
    binary = build / "ub_simd_check"
    if not binary.is_file():
        raise BuildError(f"the SIMD check program was not built in {build}")
    return binary


def run_check(target: Target, binary: Path) -> int:
    cmd = [str(binary)] if target.runs_on_host else target.emulator_command(str(binary))
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=300).returncode
