# ubitrain: what every Cortex-M target shares (included by targets/cortex-m*/toolchain.cmake,
# which set UB_CPU_FLAGS and UB_LINKER_SCRIPT first). Bare metal, newlib with semihosting
# (rdimon.specs): stdio and exit() reach the host through the debugger/emulator.
set(CMAKE_SYSTEM_NAME Generic)
set(CMAKE_SYSTEM_PROCESSOR arm)
set(CMAKE_C_COMPILER arm-none-eabi-gcc)
set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)  # no board to link a test program for
set(CMAKE_C_FLAGS_INIT "${UB_CPU_FLAGS} -ffunction-sections -fdata-sections")
set(CMAKE_EXE_LINKER_FLAGS_INIT
    "${UB_CPU_FLAGS} --specs=rdimon.specs -T${UB_LINKER_SCRIPT} -L${CMAKE_CURRENT_LIST_DIR} -Wl,--gc-sections -Wl,-Map=driver.map")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# The driver program links the board's start code; it talks to the host over semihosting.
set(UB_TARGET_SOURCES ${CMAKE_CURRENT_LIST_DIR}/startup_cortex_m.c)
set(UB_TARGET_LIBS m)
set(UB_DRIVER_IO semihosting)
# The programs that run without a debugger (-DUB_BUILD_BOARD=ON: the example firmware and
# the driver over the UART) link this instead: start code and UART0 of the MPS2 board.
set(UB_BOARD_SOURCES ${CMAKE_CURRENT_LIST_DIR}/board_mps2.c)
