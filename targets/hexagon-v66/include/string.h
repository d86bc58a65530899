/* ubitrain hexagon-v66: the string functions of the freestanding build (ub_hexagon_crt.c). */
#ifndef UB_HEXAGON_STRING_H
#define UB_HEXAGON_STRING_H
#include <stddef.h>
void *memcpy(void *restrict dst, const void *restrict src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
#endif
