# ubitrain target cortex-m7: Cortex-M7 (double-precision FPU fpv5-d16, hard-float ABI) on the
# mps2-an500 board, with arm-none-eabi-gcc and newlib.
#   cmake -S <project> -B build -DCMAKE_TOOLCHAIN_FILE=<this file> -DUB_BUILD_DRIVER=ON
set(UB_CPU_FLAGS "-mcpu=cortex-m7 -mthumb -mfloat-abi=hard -mfpu=fpv5-d16")
set(UB_LINKER_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/mps2-an500.ld)
include(${CMAKE_CURRENT_LIST_DIR}/../arm-none-eabi/common.cmake)
