/* ubitrain hexagon-v66: the float maths of the freestanding build (ub_hexagon_libm.c).
 * Single precision only: v66 has no double-precision multiply and this build has no
 * compiler-rt, so the target accumulates in float32 (targets/registry.py). */
#ifndef UB_HEXAGON_MATH_H
#define UB_HEXAGON_MATH_H
#define NAN __builtin_nanf("")
#define INFINITY __builtin_inff()
#define HUGE_VALF __builtin_huge_valf()
#define isnan(x) __builtin_isnan(x)
#define isinf(x) __builtin_isinf(x)
#define isfinite(x) __builtin_isfinite(x)
float fabsf(float x);
float floorf(float x);
float ceilf(float x);
float truncf(float x);
float nearbyintf(float x);
float sqrtf(float x);
float expf(float x);
float exp2f(float x);
float expm1f(float x);
float logf(float x);
float log2f(float x);
float log1pf(float x);
float powf(float x, float y);
float tanhf(float x);
float erff(float x);
float sinf(float x);
float cosf(float x);
float fmodf(float x, float y);
#endif
