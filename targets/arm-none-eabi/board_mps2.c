/* ubitrain: board support for the programs that run without a debugger (the example firmware
 * board_main.c and the driver over a UART): the vector table, the reset code and UART0 of an
 * MPS2 board (mps2-an386, mps2-an500; QEMU connects UART0 to its first -serial).
 *
 * Unlike startup_cortex_m.c, nothing here uses semihosting: the programs run on a board with
 * no probe attached. Reset_Handler enables the FPU (CPACR bits 20-23), copies .data from
 * flash, zeroes .bss and calls main(); when main returns, ub_sys_exit halts the core.
 *
 * UART0 is ARM's CMSDK APB UART at 0x40004000: DATA (+0x00), STATE (+0x04: bit 0 TX full,
 * bit 1 RX full), CTRL (+0x08: bit 0 TX enable, bit 1 RX enable), BAUDDIV (+0x10). The baud
 * divisor is the board's peripheral clock (25 MHz on MPS2) over the baud rate; another board
 * replaces this file (the toolchain file names it in UB_BOARD_SOURCES) with its own UART.
 *
 * It provides the I/O of driver.c built with UB_DRIVER_IO_SYSCALL (ub_sys_read, ub_sys_write,
 * ub_sys_exit on fds 0 and 1, both the UART) and ub_board_write for board_main.c.
 * Define UB_BOARD_SEMIHOSTING_EXIT to end the program through semihosting when main returns
 * (QEMU with -semihosting-config enable=on then exits with main's status); without it the
 * core sleeps, as on a board. */
#include <stdint.h>

#ifndef UB_BOARD_UART_BASE
#define UB_BOARD_UART_BASE 0x40004000u
#endif
#ifndef UB_BOARD_UART_CLOCK_HZ
#define UB_BOARD_UART_CLOCK_HZ 25000000u
#endif
#ifndef UB_BOARD_BAUD
#define UB_BOARD_BAUD 115200u
#endif

#define UB_UART_DATA (*(volatile uint32_t *)(UB_BOARD_UART_BASE + 0x00u))
#define UB_UART_STATE (*(volatile uint32_t *)(UB_BOARD_UART_BASE + 0x04u))
#define UB_UART_CTRL (*(volatile uint32_t *)(UB_BOARD_UART_BASE + 0x08u))
#define UB_UART_BAUDDIV (*(volatile uint32_t *)(UB_BOARD_UART_BASE + 0x10u))

extern uint32_t __stack_top__[], __data_load__[], __data_start__[], __data_end__[];
extern uint32_t __bss_start__[], __bss_end__[];
extern int main(void);

void Reset_Handler(void);
void Fault_Handler(void);
long ub_sys_read(int fd, void *buf, unsigned long n);
long ub_sys_write(int fd, const void *buf, unsigned long n);
void ub_sys_exit(int status);
void ub_board_write(const char *text);

static void ub_uart_init(void) {
    UB_UART_BAUDDIV = UB_BOARD_UART_CLOCK_HZ / UB_BOARD_BAUD;
    UB_UART_CTRL = 0x3u; /* TX and RX enabled, no interrupts */
}

static void ub_uart_put(uint8_t c) {
    while (UB_UART_STATE & 0x1u) {
    }
    UB_UART_DATA = c;
}

static uint8_t ub_uart_get(void) {
    while (!(UB_UART_STATE & 0x2u)) {
    }
    return (uint8_t)UB_UART_DATA;
}

long ub_sys_read(int fd, void *buf, unsigned long n) {
    uint8_t *p = (uint8_t *)buf;
    (void)fd;
    for (unsigned long i = 0; i < n; ++i) p[i] = ub_uart_get();
    return (long)n;
}

long ub_sys_write(int fd, const void *buf, unsigned long n) {
    const uint8_t *p = (const uint8_t *)buf;
    (void)fd;
    for (unsigned long i = 0; i < n; ++i) ub_uart_put(p[i]);
    return (long)n;
}

void ub_board_write(const char *text) {
    while (*text) ub_uart_put((uint8_t)*text++);
}

void ub_sys_exit(int status) {
    while (UB_UART_STATE & 0x1u) { /* the last byte out */
    }
#if defined(UB_BOARD_SEMIHOSTING_EXIT)
    /* SYS_EXIT_EXTENDED: ADP_Stopped_ApplicationExit with the status */
    uint32_t block[2] = {0x20026u, (uint32_t)status};
    register uint32_t op __asm("r0") = 0x20u;
    register uint32_t *arg __asm("r1") = block;
    __asm volatile("bkpt 0xab" : : "r"(op), "r"(arg) : "memory");
#else
    (void)status;
#endif
    for (;;) {
        __asm volatile("wfi");
    }
}

void Reset_Handler(void) {
    *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20; /* CPACR: CP10, CP11 full access */
    __asm volatile("dsb\n\tisb" ::: "memory");
    const uint32_t *src = __data_load__;
    for (uint32_t *dst = __data_start__; dst < __data_end__;) *dst++ = *src++;
    for (uint32_t *dst = __bss_start__; dst < __bss_end__;) *dst++ = 0;
    ub_uart_init();
    ub_sys_exit(main());
}

/* A fault is reported on the UART and halts the program (status 4). */
void Fault_Handler(void) {
    ub_board_write("\r\nub_board: fault\r\n");
    ub_sys_exit(4);
}

typedef void (*ub_vector)(void);
__attribute__((section(".vectors"), used)) const ub_vector ub_board_vector_table[16] = {
    (ub_vector)(uintptr_t)__stack_top__, /* initial SP */
    Reset_Handler, Fault_Handler /* NMI */, Fault_Handler /* HardFault */,
    Fault_Handler /* MemManage */, Fault_Handler /* BusFault */, Fault_Handler /* UsageFault */,
    0, 0, 0, 0, Fault_Handler /* SVCall */, Fault_Handler /* DebugMon */, 0,
    Fault_Handler /* PendSV */, Fault_Handler /* SysTick */,
};
