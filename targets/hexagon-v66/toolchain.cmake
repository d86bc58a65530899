# ubitrain target hexagon-v66: the Hexagon v66 DSP (HVX, 128-byte vectors) with clang, freestanding.
#   cmake -S <project> -B build -DCMAKE_TOOLCHAIN_FILE=<this file> -DUB_BUILD_DRIVER=ON
# There is no C library for Hexagon here: ub_hexagon_crt.c has the start code, the Linux
# system calls (qemu-hexagon runs Linux user-mode binaries) and the string functions;
# ub_hexagon_libm.c has the float maths the kernels call and the float division that the
# compiler leaves to a runtime routine. include/ holds their headers.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR hexagon)
set(CMAKE_C_COMPILER clang)
set(CMAKE_C_COMPILER_TARGET hexagon-unknown-linux-musl)
find_program(UB_LLVM_AR NAMES llvm-ar llvm-ar-14 llvm-ar-15 llvm-ar-16 REQUIRED)
find_program(UB_LLVM_RANLIB NAMES llvm-ranlib llvm-ranlib-14 llvm-ranlib-15 llvm-ranlib-16 REQUIRED)
set(CMAKE_AR ${UB_LLVM_AR} CACHE FILEPATH "archiver for Hexagon objects")
set(CMAKE_RANLIB ${UB_LLVM_RANLIB} CACHE FILEPATH "ranlib for Hexagon archives")
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # nothing to link a test program against
# -mhvx is left out: the scalar kernels do not need it, and clang 14's "Hexagon Vector
# Combine" pass crashes on the generated train_step when HVX auto-vectorization is on.
# HVX micro-kernels will add -mhvx -mhvx-length=128b to their own files.
set(CMAKE_C_FLAGS_INIT
    "-mcpu=hexagonv66 -ffreestanding -fno-math-errno -ffunction-sections -fdata-sections")
set(CMAKE_EXE_LINKER_FLAGS_INIT "-nostdlib -static -fuse-ld=lld -Wl,--gc-sections")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(UB_TARGET_INCLUDES ${CMAKE_CURRENT_LIST_DIR}/include)
set(UB_TARGET_SOURCES ${CMAKE_CURRENT_LIST_DIR}/ub_hexagon_crt.c ${CMAKE_CURRENT_LIST_DIR}/ub_hexagon_libm.c)
set(UB_TARGET_LIBS "")
set(UB_FREESTANDING ON CACHE BOOL "no stdio on Hexagon")
set(UB_DRIVER_IO syscall)
