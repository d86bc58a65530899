"""The ISA variants of the int8 inner loops (templates/niti_simd.c.j2, each ISA's own loops in
niti_simd_<isa>.c.j2), and a check program that runs each variant beside the scalar one on
the target (or its emulator).

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


def render_simd(isa: str, prefix: str = "ub_niti_") -> str:
    return ENV.get_template("niti_simd.c.j2").render(isa=isa, prefix=prefix)


CHECK_MAIN = r"""
static uint32_t check_state = 12345u;
static int8_t check_next(void) {  /* LCG bytes, every value of int8 including -128 */
    check_state = check_state * 1664525u + 1013904223u;
    return (int8_t)(check_state >> 24);
}

static int32_t check_word(void) {  /* int32 of every magnitude, INT32_MIN included */
    const uint32_t hi = (uint8_t)check_next(), bits = hi % 33u;
    uint32_t v = ((uint32_t)(uint8_t)check_next() << 24) ^ ((uint32_t)(uint8_t)check_next() << 12)
                 ^ (uint8_t)check_next();
    v = bits == 32u ? v : v & ((1u << bits) - 1u);
    return hi == 255u ? INT32_MIN : (check_next() < 0 ? -(int32_t)(v >> 1) : (int32_t)(v >> 1));
}

enum { CHECK_N = 4096 };
static int8_t a[CHECK_N], b[CHECK_N], w8[CHECK_N], out_ref[CHECK_N], out_isa[CHECK_N];
static int32_t acc_ref[CHECK_N], acc_isa[CHECK_N], words[CHECK_N];

/* gemm shapes around the 4-row, 16- and 8-column blocks and the 16/8-lane steps; the exit
 * codes stay below 256 (a process status) */
static int check_gemm(void) {
    static const uint32_t dims[][3] = {{1, 1, 1}, {4, 9, 16}, {5, 7, 24}, {8, 9, 64},
                                       {16, 72, 16}, {3, 16, 31}, {7, 3, 9}, {72, 16, 16},
                                       {2, 33, 5}};
    for (uint32_t t = 0; t < sizeof dims / sizeof dims[0]; ++t) {
        const uint32_t rows = dims[t][0], inner = dims[t][1], cols = dims[t][2];
        for (uint32_t i = 0; i < rows * inner; ++i) a[i] = t % 2 ? -128 : check_next();
        for (uint32_t i = 0; i < inner * cols; ++i) b[i] = t % 3 == 1 ? -128 : check_next();
        ref_gemm_nn_s8(acc_ref, a, inner, 1u, b, rows, inner, cols);
        isa_gemm_nn_s8(acc_isa, a, inner, 1u, b, rows, inner, cols);
        if (memcmp(acc_ref, acc_isa, 4 * rows * cols)) return 100 + (int)t;
        ref_gemm_nn_s8(acc_ref, a, 1u, rows, b, inner, rows, cols);  /* A transposed */
        isa_gemm_nn_s8(acc_isa, a, 1u, rows, b, inner, rows, cols);
        if (memcmp(acc_ref, acc_isa, 4 * inner * cols)) return 120 + (int)t;
        /* nt: two segments of [rows, len] x [cols, len], len = cols of above */
        const uint32_t len = cols, segs = 2;  /* CHECK_N holds both */
        for (uint32_t i = 0; i < rows * inner; ++i) acc_ref[i] = acc_isa[i] = check_next();
        ref_gemm_nt_s8(acc_ref, a, b, rows, inner, len, segs, rows * len, inner * len);
        isa_gemm_nt_s8(acc_isa, a, b, rows, inner, len, segs, rows * len, inner * len);
        if (memcmp(acc_ref, acc_isa, 4 * rows * inner)) return 140 + (int)t;
    }
    return 0;
}

static int check_rows(void) {
    static const uint32_t lengths[] = {0, 1, 7, 8, 9, 16, 33, 1100};
    for (uint32_t t = 0; t < sizeof lengths / sizeof lengths[0]; ++t)
        for (int32_t s = 0; s < 32; ++s) {
            const uint32_t n = lengths[t];
            for (uint32_t i = 0; i < n; ++i) {
                words[i] = check_word();
                w8[i] = check_next();
            }
            if (ref_or_abs(words, n) != isa_or_abs(words, n)) return 200;
            const uint32_t limit = s % 3 == 0 ? 0xFFFFFFFFu : 1u << (s % 3 == 1 ? s : 31 - s / 2);
            const int32_t sat_ref = ref_round_rows(words, out_ref, n, s, limit);
            if (sat_ref != isa_round_rows(words, out_isa, n, s, limit)
                || memcmp(out_ref, out_isa, n)) return 210;
            const int32_t psto_ref = ref_psto_rows(w8, words, out_ref, n, s, limit);
            if (psto_ref != isa_psto_rows(w8, words, out_isa, n, s, limit)
                || memcmp(out_ref, out_isa, n)) return 220;
            memcpy(out_isa, w8, n);  /* in place, as ub_niti_update uses it */
            isa_psto_rows(out_isa, words, out_isa, n, s, limit);
            if (memcmp(out_ref, out_isa, n)) return 230;
        }
    return 0;
}

int main(void) {
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
    const int gemm = check_gemm();
    return gemm ? gemm : check_rows();
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
target_compile_options(ub_simd_check PRIVATE -O2 -Wall ${UB_CHECK_FLAGS})
"""


def build_check(target: Target, isa: str, work: Path, toolchain: Path | None,
                flags: str = "") -> Path:
    """The check program of `isa` against scalar, built for `target` (plus compiler `flags`,
    e.g. -march=armv8.2-a+dotprod for NEON's SDOT path)."""
    work.mkdir(parents=True, exist_ok=True)
    source = ("#include <stdint.h>\n#include <string.h>\n"
              "#define UB_MAYBE_UNUSED __attribute__((unused))  /* as ub_runtime.h */\n"
              + render_simd("scalar", "ref_")
              + render_simd(isa, "isa_") + CHECK_MAIN)
    (work / "check.c").write_text(source)
    (work / "CMakeLists.txt").write_text(CHECK_CMAKE)
    build = cmake_build(work, work / "build", shared=False, toolchain=toolchain,
                        extra_args=(f"-DUB_CHECK_FLAGS={flags}",) if flags else ())
    binary = build / "ub_simd_check"
    if not binary.is_file():
        raise BuildError(f"the SIMD check program was not built in {build}")
    return binary


def run_check(target: Target, binary: Path) -> int:
    cmd = [str(binary)] if target.runs_on_host else target.emulator_command(str(binary))
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=300).returncode
