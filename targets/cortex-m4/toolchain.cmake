# ubitrain target cortex-m4: Cortex-M4F (single-precision FPU fpv4-sp-d16, hard-float ABI) on
# the mps2-an386 board, with arm-none-eabi-gcc and newlib.
#   cmake -S <project> -B build -DCMAKE_TOOLCHAIN_FILE=<this file> -DUB_BUILD_DRIVER=ON
set(UB_CPU_FLAGS "-mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16")
set(UB_LINKER_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/mps2-an386.ld)
include(${CMAKE_CURRENT_LIST_DIR}/../arm-none-eabi/common.cmake)
