/* ubitrain runtime: what every generated model shares. No malloc, no global state. */
#ifndef UB_RUNTIME_H
#define UB_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "ub_math.h"
#include "ub_status.h"

/* A kernel of the step. Not inlined into the step function: there its `restrict` parameters
 * would become pointers into the one arena, and gcc then vectorises less and allocates
 * registers over one huge function (mobilenetv2_small at batch 32: 13.4 ms inlined, 7.5 ms
 * not, on x86-64). */
#if defined(UB_KERNEL_EXTERN) /* a large model's model_kernels_<i>.c: model.c calls them */
#define UB_KERNEL_LINKAGE
#else
#define UB_KERNEL_LINKAGE static
#endif
#if defined(__GNUC__)
#define UB_KERNEL UB_KERNEL_LINKAGE __attribute__((noinline))
/* Shared helpers of an ISA's kernels (packers, GEMM cores): a model uses some of them. */
#define UB_MAYBE_UNUSED __attribute__((unused))
#else
#define UB_KERNEL UB_KERNEL_LINKAGE
#define UB_MAYBE_UNUSED
#endif
/* For a kernel with a `c ? a[i] : b[j]` whose two sides both load (a concatenation, a
 * split's gradient): GCC 12's loop vectorizer (-O3 with AVX2, Debian 12's gcc 12.2) reads
 * one side at a wrong offset once it if-converts the two conditional loads of such nests,
 *   for a, b, c: out[a*24 + b*2 + c] = 6 <= b ? in[a*12 + b*2 + c - 12] : in[a*12 + b*2 + c]
 * gives zeros where in[0..3] belong. Clang and GCC without loop vectorization are right;
 * such copy kernels lose little without it. */
#if defined(__GNUC__) && !defined(__clang__)
#define UB_NO_LOOP_VECTORIZE __attribute__((optimize("no-tree-loop-vectorize")))
#else
#define UB_NO_LOOP_VECTORIZE
#endif
/* The bytes of the file at `path` (a string literal) as the read-only array `name`, embedded
 * by the assembler's .incbin: a model's weights reach the object file without passing through
 * the C compiler as literals, so the build takes the same time for 60 thousand weights or 60
 * million; on a microcontroller they stay in flash (.rodata). 16-byte aligned. */
#if defined(__APPLE__)
#define UB_EMBED_SECTION(name) ".pushsection __TEXT,__const\n.balign 16\n"
#define UB_EMBED_SIZE(name) ""
#else  /* ELF: a data object of its own size, as a C array would be (nm, readelf, map files) */
#define UB_EMBED_SECTION(name) ".pushsection .rodata\n.balign 16\n.type " #name ", %object\n"
#define UB_EMBED_SIZE(name) ".size " #name ", . - " #name "\n"
#endif
#define UB_EMBED_FILE(name, path)                                                             \
    __asm__(UB_EMBED_SECTION(name) #name ":\n.incbin \"" path "\"\n"                        \
            UB_EMBED_SIZE(name) ".popsection\n");                                            \
    extern const uint8_t name[] __asm__(#name) __attribute__((visibility("hidden")))
#define UB_MIN(a, b) ((a) < (b) ? (a) : (b))
#define UB_MAX(a, b) ((a) > (b) ? (a) : (b))
/* Float min/max that propagate NaN like PyTorch's relu, clamp and max-pool do. `|`, not
 * `||`: both tests are evaluated, so the compiler sees no branch and can vectorise the loop
 * (a compare, a compare, an or, a select); a and b are evaluated either way. */
#define UB_FMIN(a, b) ((((a) != (a)) | ((a) < (b))) ? (a) : (b))
#define UB_FMAX(a, b) ((((a) != (a)) | ((a) > (b))) ? (a) : (b))
/* The same against a bound k that is no NaN (clip, ReLU): a NaN x fails the one compare and
 * is passed on. Where x equals k, x is kept: relu(-0.0f) is -0.0f (PyTorch gives +0.0f,
 * which compares equal and gives the same sums downstream). float32 kernels use
 * ub_fmax_k_f32 / ub_fmin_k_f32 (ub_math.h), which read x once. */
#define UB_FMIN_K(x, k) (((k) < (x)) ? (k) : (x))
#define UB_FMAX_K(x, k) (((k) > (x)) ? (k) : (x))
#define UB_TRY(call)                  \
    do {                              \
        int32_t ub_status_ = (call);  \
        if (ub_status_ != UB_OK) {    \
            return ub_status_;        \
        }                             \
    } while (0)

/* Integer division and modulo rounding toward negative infinity (TIR's floordiv). */
static inline int32_t ub_floordiv_i32(int32_t a, int32_t b) {
    int32_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int32_t ub_floormod_i32(int32_t a, int32_t b) { return a - ub_floordiv_i32(a, b) * b; }
static inline int64_t ub_floordiv_i64(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t ub_floormod_i64(int64_t a, int64_t b) { return a - ub_floordiv_i64(a, b) * b; }

/* SplitMix64: a small, fast, seedable generator whose sequence is easy to reproduce. */
uint64_t ub_rng_next(uint64_t *state);

/* Fill `mask` with 0 (probability p) or `scale` = 1/(1-p): the inverted-dropout mask. The
 * masks differ from PyTorch's (a different generator); their distribution is the same. The
 * compiler computes `scale` (in double, rounded once), so that no target needs double
 * arithmetic at run time (Hexagon v66 has no double divide). */
void ub_dropout_mask(uint64_t *state, float *mask, size_t n, float p, float scale);

/* UB_ERR_NONFINITE_LOSS when the loss is NaN or infinite. */
int32_t ub_check_loss(const float *loss);

#endif
