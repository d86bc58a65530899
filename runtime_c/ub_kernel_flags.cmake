# The optimisation flags of the kernels, in one place: the generated project (its
# CMakeLists.txt) and the micro-kernel harness (tools/microkernels/harness.py) both call
# ub_kernel_flags, so that the harness measures the code a project runs.
function(ub_kernel_flags target)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
    return()
  endif()
  target_compile_options(${target} PRIVATE -fno-math-errno $<$<CONFIG:Release>:-O2>)
  # -O3 on the host and on AArch64 (phones: code size is no constraint there): its
  # vectoriser turns the printed elementwise and reduction kernels into NEON code, which -O2's
  # cheap cost model mostly leaves scalar (benchmarks/elementwise_icount.py counts it).
  if(NOT CMAKE_CROSSCOMPILING OR CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
    target_compile_options(${target} PRIVATE $<$<CONFIG:Release>:-O3>)
  endif()
  # A host build is for the machine that builds it: its whole vector ISA for the printed
  # kernels too (AVX2 on x86-64, whose baseline has only SSE2). Without contraction into
  # FMA, which that ISA would bring, they round as the baseline build does. Generic tuning:
  # tuned for Zen 3, the AVX2 micro-kernels' tiles ran up to a third slower.
  option(UB_NATIVE "host build: compile for this machine's processor (-march=native)" ON)
  if(UB_NATIVE AND NOT CMAKE_CROSSCOMPILING)
    include(CheckCCompilerFlag)
    check_c_compiler_flag(-march=native UB_HAS_MARCH_NATIVE)
    if(UB_HAS_MARCH_NATIVE)
      target_compile_options(${target} PRIVATE -march=native -mtune=generic -ffp-contract=off)
    endif()
  endif()
  # GCC 12's vectoriser (x86 AVX2 and AVX-512) turns the conditional load of a printed
  # gradient (`argmax == w ? dy[...] : 0`) into masked loads from the wrong address when it
  # merges the loops around it (fuzz seed 60367, tests/test_fidelity_regressions.py). Without
  # loop if-conversion it makes no masked loads; steps measured 0-3% slower.
  if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -fno-tree-loop-if-convert)
  endif()
endfunction()
