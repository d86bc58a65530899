/* ubitrain: reset code for the Cortex-M boards (mps2-an386, mps2-an500; any ARMv7E-M part).
 *
 * The vector table's first two words are the initial stack pointer and the reset handler.
 * Reset_Handler enables the FPU (CPACR bits 20-23: full access to CP10 and CP11) before any
 * float instruction runs, copies .data from flash to SRAM, and enters newlib's _start
 * (rdimon-crt0 with --specs=rdimon.specs), which zeroes .bss, opens the semihosting
 * stdin/stdout, runs main() and reports its exit status to the debugger or emulator. */
#include <stdint.h>

extern uint32_t __stack_top__[], __data_load__[], __data_start__[], __data_end__[];
extern void _start(void);

void Reset_Handler(void);
void Fault_Handler(void);

void Reset_Handler(void) {
    *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20; /* CPACR: CP10, CP11 full access */
    __asm volatile("dsb\n\tisb" ::: "memory");
    const uint32_t *src = __data_load__;
    for (uint32_t *dst = __data_start__; dst < __data_end__;) *dst++ = *src++;
    _start();
    for (;;) {
    }
}

/* A fault ends the program through semihosting (SYS_EXIT, reason "run-time error"), so
 * the emulator exits with a failure status instead of hanging; on a board without a debugger
 * attached, the breakpoint halts the core where it faulted. */
void Fault_Handler(void) {
    register uint32_t op __asm("r0") = 0x18u;          /* SYS_EXIT */
    register uint32_t reason __asm("r1") = 0x20023u;   /* ADP_Stopped_RunTimeErrorUnknown */
    __asm volatile("bkpt 0xab" : : "r"(op), "r"(reason) : "memory");
    for (;;) {
    }
}

typedef void (*ub_vector)(void);
__attribute__((section(".vectors"), used)) const ub_vector ub_vector_table[16] = {
    (ub_vector)(uintptr_t)__stack_top__, /* initial SP */
    Reset_Handler, Fault_Handler /* NMI */, Fault_Handler /* HardFault */,
    Fault_Handler /* MemManage */, Fault_Handler /* BusFault */, Fault_Handler /* UsageFault */,
    0, 0, 0, 0, Fault_Handler /* SVCall */, Fault_Handler /* DebugMon */, 0,
    Fault_Handler /* PendSV */, Fault_Handler /* SysTick */,
};
