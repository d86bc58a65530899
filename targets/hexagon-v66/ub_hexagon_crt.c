/* ubitrain hexagon-v66: start code, Linux system calls and string functions for a
 * freestanding Hexagon program (there is no C library for Hexagon here).
 *
 * qemu-hexagon runs Linux user-mode binaries: the kernel (or QEMU) sets up the stack and
 * zeroes .bss, then jumps to _start. A system call is `trap0(#1)` with its number in r6
 * (63 read, 64 write, 94 exit_group) and its arguments in r0-r2; the result comes back in
 * r0 (a negative errno on failure). */
#include <stddef.h>
#include <stdint.h>

int main(void);
long ub_sys_read(int fd, void *buf, unsigned long n);
long ub_sys_write(int fd, const void *buf, unsigned long n);
void ub_sys_exit(int status);

static long ub_syscall3(long number, long a0, long a1, long a2) {
    register long r0 __asm__("r0") = a0;
    register long r1 __asm__("r1") = a1;
    register long r2 __asm__("r2") = a2;
    register long r6 __asm__("r6") = number;
    __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r6) : "memory");
    return r0;
}

long ub_sys_read(int fd, void *buf, unsigned long n) {
    long got;
    do {
        got = ub_syscall3(63, fd, (long)buf, (long)n);
    } while (got == -4); /* EINTR */
    return got;
}

long ub_sys_write(int fd, const void *buf, unsigned long n) {
    return ub_syscall3(64, fd, (long)buf, (long)n);
}

void ub_sys_exit(int status) {
    for (;;) ub_syscall3(94, status, 0, 0);
}

void _start(void) { ub_sys_exit(main()); }

/* Byte loops: the compiler must not turn them back into calls of themselves, hence
 * no_builtin (and -ffreestanding). Sizes here are small (tensor copies of a step). */
__attribute__((no_builtin)) void *memcpy(void *restrict dst, const void *restrict src, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    if ((((uintptr_t)d | (uintptr_t)s | n) & 3u) == 0) {
        for (size_t i = 0; i < n / 4; ++i) ((uint32_t *)d)[i] = ((const uint32_t *)s)[i];
        return dst;
    }
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
    return dst;
}

__attribute__((no_builtin)) void *memmove(void *dst, const void *src, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    if (d < s) {
        for (size_t i = 0; i < n; ++i) d[i] = s[i];
    } else {
        for (size_t i = n; i > 0; --i) d[i - 1] = s[i - 1];
    }
    return dst;
}

__attribute__((no_builtin)) void *memset(void *dst, int c, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    for (size_t i = 0; i < n; ++i) d[i] = (uint8_t)c;
    return dst;
}

__attribute__((no_builtin)) int memcmp(const void *a, const void *b, size_t n) {
    const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
    for (size_t i = 0; i < n; ++i) {
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    }
    return 0;
}

__attribute__((no_builtin)) size_t strlen(const char *s) {
    size_t n = 0;
    while (s[n]) ++n;
    return n;
}
