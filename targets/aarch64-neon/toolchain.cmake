# ubitrain target aarch64-neon: AArch64 Linux (the Android arm64-v8a ISA) with aarch64-linux-gnu-gcc.
#   cmake -S <project> -B build -DCMAKE_TOOLCHAIN_FILE=<this file> -DUB_BUILD_DRIVER=ON
# The binaries run under qemu-aarch64 -L /usr/aarch64-linux-gnu (see README.md). On a user's
# machine the Android NDK builds the very same project instead:
#   -DCMAKE_TOOLCHAIN_FILE=$ANDROID_NDK/build/cmake/android.toolchain.cmake -DANDROID_ABI=arm64-v8a
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_C_FLAGS_INIT "-march=armv8-a")
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
# How the generated driver program talks to its host: stdin/stdout.
set(UB_DRIVER_IO stdio)
