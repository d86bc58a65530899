/* ubitrain runtime: expf, tanhf and erff as branch-free inline functions, so that a loop that
 * calls them (GELU, sigmoid, softmax) still vectorizes; libm's versions are calls, one
 * element at a time. Accurate to a few ulp against float64 (tests/test_ub_math.py); NaN in,
 * NaN out. Polynomial coefficients: least-squares Chebyshev fits in float64,
 * scripts/fit_math.py. */
#ifndef UB_MATH_H
#define UB_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* c ? a : b on the bits of two values computed already: with C's ?: on floats GCC keeps a
 * branch (under -ftrapping-math, its default, it may not compute both sides; or where the
 * in-place kernels' pointers may alias), and a loop with a branch does not vectorize. The C
 * printer writes TIR's Select with it. */
static inline float ub_pick_f32(int c, float a, float b) {
    uint32_t ua, ub;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    const uint32_t mask = 0u - (uint32_t)(c != 0), bits = (ua & mask) | (ub & ~mask);
    float r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

/* A float's bits and back (TIR's reinterpret): NITI's quantize reads exponent and mantissa
 * from them and builds the exact power of two 2^e. memcpy is the defined way in C; compilers
 * turn it into a register move. */
static inline uint32_t ub_bits_of_f32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float ub_f32_of_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* max(x, k) and min(x, k) against a bound k that is no NaN (ReLU, clip), PyTorch's way: a NaN
 * x fails the one compare and is passed on; where x equals k, x is kept (relu(-0.0f) is -0.0f,
 * which compares equal to PyTorch's +0.0f). With float SIMD, x is chosen on bits: the macro
 * UB_FMAX_K's ?: read x twice, and over an in-place buffer GCC threaded it into branches (an
 * in-place add+ReLU ran scalar on AArch64 at -O3). A scalar FPU (Cortex-M, Hexagon) selects
 * in one instruction or two, where the bit choice would cost integer moves. */
#if defined(__ARM_NEON) || defined(__SSE2__)
static inline float ub_fmax_k_f32(float x, float k) { return ub_pick_f32(k > x, k, x); }
static inline float ub_fmin_k_f32(float x, float k) { return ub_pick_f32(k < x, k, x); }
#else
static inline float ub_fmax_k_f32(float x, float k) { return k > x ? k : x; }
static inline float ub_fmin_k_f32(float x, float k) { return k < x ? k : x; }
#endif

/* bit operations, never calls (hexagon-v66's freestanding libm has no copysignf) */
#if defined(__GNUC__)
#define UB_FABSF(x) __builtin_fabsf(x)
#define UB_COPYSIGNF(x, s) __builtin_copysignf(x, s)
#else
#define UB_FABSF(x) fabsf(x)
#define UB_COPYSIGNF(x, s) copysignf(x, s)
#endif

/* e^x = 2^n e^r, n = x log2(e) rounded (adding and removing 1.5 * 2^23 rounds to nearest),
 * r = x - n ln 2 with ln 2 in two parts (n * the high part is exact), so |r| <= ln2/2 and the
 * Taylor series of e^r to r^7 leaves less than 2^-26. 2^n is applied as 2^(n/2) 2^(n - n/2),
 * two normal powers: exact where e^x is normal, one rounding where it is denormal or beyond
 * FLT_MAX, as IEEE float32 (and PyTorch) gives it: 0 below e^-104 and inf above e^88.8 (x is
 * held to [-104, 89], where both already hold). A floor at FLT_MIN instead made a gradient
 * that flows through e^-115 (a softmax weight) 1e13 times too large (fuzz seed 90663). */
static inline float ub_expf(float x) {
    float c = ub_pick_f32(x < -104.0f, -104.0f, x); /* NaN passes both, as NaN */
    c = ub_pick_f32(c > 89.0f, 89.0f, c);
    float n = (c * 1.44269502f + 12582912.0f) - 12582912.0f;
    n = ub_pick_f32(n == n, n, 0.0f);
    const float r = (c - n * 0.693145752f) - n * 1.42860677e-6f;
    const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24
                    + r * (1.0f / 120 + r * (1.0f / 720 + r * (1.0f / 5040)))))));
    const int32_t half = (int32_t)n / 2, bits_a = (half + 127) * (1 << 23),
                  bits_b = ((int32_t)n - half + 127) * (1 << 23);
    float scale_a, scale_b;
    memcpy(&scale_a, &bits_a, sizeof scale_a);
    memcpy(&scale_b, &bits_b, sizeof scale_b);
    return p * scale_a * scale_b; /* NaN: r, p and so the result are NaN */
}

/* |x| < 0.625: x + x^3 P(x^2); else sign(x) (1 - 2 / (e^(2|x|) + 1)), |x| held to 10 (where
 * tanh rounds to 1). Both are computed and one selected: no branch. */
static inline float ub_tanhf(float x) {
    const float a = UB_FABSF(x), u = x * x;
    const float small = x + x * u * (((((0.00229567569f * u - 0.00834680256f) * u
                        + 0.0217698906f) * u - 0.0539593957f) * u + 0.133333042f) * u
                        - 0.333333343f);
    const float e = ub_expf(2.0f * ub_pick_f32(a > 10.0f, 10.0f, a));
    const float big = UB_COPYSIGNF(1.0f - 2.0f / (e + 1.0f), x);
    return ub_pick_f32(a < 0.625f, small, big); /* NaN fails the test: big, NaN */
}

/* |x| < 1: x P(x^2); else sign(x) (1 - e^(-x^2) Q(t)), t = 1 / (1 + |x|/2), |x| held to 4
 * (where erf rounds to 1). */
static inline float ub_erff(float x) {
    const float a = UB_FABSF(x), u = x * x;
    const float small = x * ((((((7.88249745e-05f * u - 0.000801885501f) * u + 0.00518931216f)
                        * u - 0.0268543288f) * u + 0.112835974f) * u - 0.37612626f) * u
                        + 1.12837911f);
    const float b = ub_pick_f32(a > 4.0f, 4.0f, a), t = 1.0f / (1.0f + 0.5f * b);
    const float q = ((((((((0.0129329115f * t + 0.0685304627f) * t - 0.384646118f) * t
                    + 0.479816377f) * t - 0.0537935682f) * t + 0.328946322f) * t
                    + 0.264107674f) * t + 0.284325778f) * t - 0.000120402561f);
    const float big = UB_COPYSIGNF(1.0f - ub_expf(-b * b) * q, x);
    return ub_pick_f32(a < 1.0f, small, big); /* NaN: big, which is NaN */
}

#endif
