/* ubitrain hexagon-v66: the maths of a freestanding Hexagon build, written for it.
 *
 * Hexagon has no divide instruction and this build has no compiler-rt, so
 * __hexagon_divsf3 (the routine the compiler calls for `a / b` on floats),
 * __hexagon_divdi3 (on int64: NITI's softmax gradient) and __hexagon_udivdi3 (on uint64:
 * the integer BatchNorm's rounded divisions) are here too.
 * Division and square root are correctly rounded (integer long division and integer square
 * root), so they agree with the host bit for bit. exp, log and tanh use the textbook range
 * reductions with Taylor polynomials evaluated in float: within about 2 ulp of the correctly
 * rounded value on the ranges training meets, which keeps a training run within 1e-4 of the
 * host. erff, sinf and cosf are within a few ulp (see each); fmodf is exact. */
#include <math.h>
#include <stdint.h>

typedef union {
    float f;
    uint32_t u;
} ub_bits;

static inline uint32_t as_u(float x) {
    ub_bits v;
    v.f = x;
    return v.u;
}

static inline float as_f(uint32_t u) {
    ub_bits v;
    v.u = u;
    return v.f;
}

/* ---- division ----------------------------------------------------------------------------- */
/* A mantissa in [2^23, 2^24) and its unbiased-by-one exponent; subnormals normalised. */
static inline uint32_t ub_unpack(uint32_t u, int32_t *e) {
    uint32_t m = u & 0x7fffffu;
    int32_t ex = (int32_t)((u >> 23) & 0xffu);
    if (ex == 0) {
        ex = 1;
        while (!(m & 0x800000u)) {
            m <<= 1;
            --ex;
        }
    } else {
        m |= 0x800000u;
    }
    *e = ex;
    return m;
}

/* 64-bit integer division, truncating toward zero as C99's `/`: shift-and-subtract. */
static uint64_t ub_udiv64(uint64_t n, uint64_t d) {
    uint64_t q = 0, r = 0;
    for (int i = 63; i >= 0; --i) {
        r = (r << 1) | ((n >> i) & 1u);
        if (r >= d) {
            r -= d;
            q |= (uint64_t)1 << i;
        }
    }
    return q;
}

int64_t __hexagon_divdi3(int64_t a, int64_t b);
int64_t __hexagon_divdi3(int64_t a, int64_t b) {
    const uint64_t ua = a < 0 ? 0u - (uint64_t)a : (uint64_t)a;
    const uint64_t ub = b < 0 ? 0u - (uint64_t)b : (uint64_t)b;
    const uint64_t q = ub_udiv64(ua, ub);
    return (a < 0) != (b < 0) ? (int64_t)(0u - q) : (int64_t)q;
}

uint64_t __hexagon_udivdi3(uint64_t a, uint64_t b);
uint64_t __hexagon_udivdi3(uint64_t a, uint64_t b) { return ub_udiv64(a, b); }

float __hexagon_divsf3(float a, float b);
float __hexagon_divsf3(float a, float b) {
    const uint32_t ua = as_u(a), ub = as_u(b);
    const uint32_t sign = (ua ^ ub) & 0x80000000u;
    const uint32_t aa = ua & 0x7fffffffu, ab = ub & 0x7fffffffu;
    if (aa > 0x7f800000u || ab > 0x7f800000u) return NAN;
    if (aa == 0x7f800000u) return ab == 0x7f800000u ? NAN : as_f(sign | 0x7f800000u);
    if (ab == 0x7f800000u) return as_f(sign);
    if (ab == 0) return aa == 0 ? NAN : as_f(sign | 0x7f800000u);
    if (aa == 0) return as_f(sign);

    int32_t ea, eb;
    uint32_t ma = ub_unpack(aa, &ea);
    const uint32_t mb = ub_unpack(ab, &eb);
    int32_t e = ea - eb + 127;
    if (ma < mb) {
        ma <<= 1;
        --e;
    }
    /* 26 quotient bits (24 of mantissa, guard, round), remainder as sticky. */
    uint32_t q = 0, r = ma;
    for (int i = 0; i < 26; ++i) {
        q <<= 1;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1;
    }
    uint32_t sticky = r != 0;
    if (e >= 255) return as_f(sign | 0x7f800000u);
    if (e <= 0) { /* subnormal result: shift out 1 - e more bits */
        const int32_t shift = 1 - e;
        if (shift > 26) return as_f(sign);
        sticky |= (q & ((1u << shift) - 1u)) != 0;
        q >>= shift;
        e = 1;
    }
    uint32_t mant = q >> 2;
    const uint32_t extra = q & 3u;
    if (extra > 2u || (extra == 2u && (sticky || (mant & 1u)))) ++mant;
    /* mant holds the implicit bit: a carry out of the mantissa moves into the exponent. */
    return as_f(sign | (((uint32_t)(e - 1) << 23) + mant));
}

/* ---- rounding ----------------------------------------------------------------------------- */
float fabsf(float x) { return as_f(as_u(x) & 0x7fffffffu); }

float truncf(float x) {
    const uint32_t u = as_u(x);
    const int32_t e = (int32_t)((u >> 23) & 0xffu) - 127;
    if (e >= 23) return x;
    if (e < 0) return as_f(u & 0x80000000u);
    return as_f(u & ~(0x7fffffu >> e));
}

float floorf(float x) {
    const float t = truncf(x);
    return t > x ? t - 1.0f : t;
}

float ceilf(float x) {
    const float t = truncf(x);
    return t < x ? t + 1.0f : t;
}

float nearbyintf(float x) { /* round half to even, by the FPU's own rounding */
    const float ax = fabsf(x);
    if (!(ax < 8388608.0f)) return x;
    const float r = (ax + 8388608.0f) - 8388608.0f;
    return as_f(as_u(r) | (as_u(x) & 0x80000000u));
}

/* ---- square root: integer square root of the mantissa, correctly rounded ----------------- */
float sqrtf(float x) {
    uint32_t u = as_u(x);
    if (u == 0 || u == 0x80000000u || u >= 0x7f800000u) {
        return (u > 0x80000000u) ? NAN : x; /* +-0, +inf, NaN; negatives are NaN */
    }
    int32_t e;
    uint32_t m = ub_unpack(u, &e);
    e -= 127; /* x = m * 2^(e - 23) */
    if (e & 1) {
        m <<= 1;
        --e;
    }
    uint64_t rem = (uint64_t)m << 23, root = 0, bit = (uint64_t)1 << 48;
    while (bit > rem) bit >>= 2;
    while (bit) {
        if (rem >= root + bit) {
            rem -= root + bit;
            root = (root >> 1) + bit;
        } else {
            root >>= 1;
        }
        bit >>= 2;
    }
    if (rem > root) ++root; /* above the midpoint: round up (a tie cannot occur) */
    return as_f(((uint32_t)(e / 2 + 126) << 23) + (uint32_t)root);
}

/* ---- exponential and logarithm -------------------------------------------------------------- */
static const float LN2_HI = 6.93145751953125e-1f; /* 16 bits: k * LN2_HI is exact */
static const float LN2_LO = 1.428606765330187e-6f;
static const float LOG2E = 1.44269504088896341f;

float expf(float x) {
    if (x != x) return x;
    if (x > 88.72283935546875f) return INFINITY;
    if (x < -103.972084045410156f) return 0.0f;
    const float kf = nearbyintf(x * LOG2E);
    const float r = (x - kf * LN2_HI) - kf * LN2_LO; /* |r| <= ln2 / 2 */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t k = (int32_t)kf;
    if (k < -125) { /* a subnormal result: scale in two steps */
        p *= as_f(0x1f800000u); /* 2^-64 */
        k += 64;
    }
    if (k > 127) {
        p *= 2.0f;
        k -= 1;
    }
    return p * as_f((uint32_t)(k + 127) << 23);
}

float expm1f(float x) {
    if (fabsf(x) >= 0.5f) return expf(x) - 1.0f;
    float p = 1.0f / 362880.0f;
    p = p * x + 1.0f / 40320.0f;
    p = p * x + 1.0f / 5040.0f;
    p = p * x + 1.0f / 720.0f;
    p = p * x + 1.0f / 120.0f;
    p = p * x + 1.0f / 24.0f;
    p = p * x + 1.0f / 6.0f;
    p = p * x + 0.5f;
    return x + x * (x * p);
}

float exp2f(float x) { return expf(x * 6.93147180559945309e-1f); }

float logf(float x) {
    uint32_t u = as_u(x);
    if (x != x) return x;
    if (u == 0 || u == 0x80000000u) return -INFINITY;
    if (u & 0x80000000u) return NAN;
    if (u == 0x7f800000u) return x;
    int32_t e = 0;
    if (u < 0x00800000u) { /* subnormal */
        x *= 33554432.0f;   /* 2^25 */
        u = as_u(x);
        e = -25;
    }
    e += (int32_t)(u >> 23) - 127;
    float m = as_f((u & 0x7fffffu) | 0x3f800000u); /* [1, 2) */
    if (m > 1.41421356f) {
        m *= 0.5f;
        ++e;
    }
    /* log(1 + f) = f - (hf2 - s (hf2 + R)), s = f / (2 + f), R = the series of 2 atanh */
    const float f = m - 1.0f;
    const float s = f / (2.0f + f);
    const float z = s * s;
    float R = 2.0f / 15.0f;
    R = R * z + 2.0f / 13.0f;
    R = R * z + 2.0f / 11.0f;
    R = R * z + 2.0f / 9.0f;
    R = R * z + 2.0f / 7.0f;
    R = R * z + 2.0f / 5.0f;
    R = R * z + 2.0f / 3.0f;
    R *= z;
    const float hf2 = 0.5f * f * f;
    const float ef = (float)e;
    return ef * LN2_HI - ((hf2 - (s * (hf2 + R) + ef * LN2_LO)) - f);
}

float log2f(float x) { return logf(x) * LOG2E; }

float log1pf(float x) { /* Kahan: log(u) * x / (u - 1) with u = 1 + x rounded */
    const float u = 1.0f + x;
    if (u == 1.0f) return x;
    if (u == INFINITY) return u;
    return logf(u) * (x / (u - 1.0f));
}

float powf(float x, float y) {
    if (y == 0.0f || x == 1.0f) return 1.0f;
    if (x != x || y != y) return NAN;
    if (y == 1.0f) return x;
    if (y == 2.0f) return x * x;
    if (y == 0.5f && x >= 0.0f && x != INFINITY) return sqrtf(x);
    if (y == -1.0f) return 1.0f / x;
    const float ty = truncf(y);
    const int is_int = ty == y;
    const int odd = is_int && fabsf(y) < 16777216.0f && ((int32_t)ty & 1);
    float ax = fabsf(x);
    if (x < 0.0f && !is_int) return NAN;
    float r;
    if (ax == 0.0f) {
        r = y > 0.0f ? 0.0f : INFINITY;
    } else if (ax == INFINITY) {
        r = y > 0.0f ? INFINITY : 0.0f;
    } else {
        r = expf(y * logf(ax));
    }
    return (x < 0.0f && odd) || (x == 0.0f && odd && (as_u(x) >> 31)) ? -r : r;
}

float tanhf(float x) {
    const float ax = fabsf(x);
    if (x != x) return x;
    if (ax < 2.44140625e-4f) return x; /* 2^-12: tanh x = x (1 - x^2/3) rounds to x */
    float t;
    if (ax > 9.0f) {
        t = 1.0f;
    } else {
        const float em = expm1f(2.0f * ax);
        t = em / (em + 2.0f);
    }
    return x < 0.0f ? -t : t;
}

/* ---- error function ----------------------------------------------------------------------- */
/* e^(-x^2) with x^2's rounding error too: x^2 = x2 + x2_lo, split exactly (Veltkamp). */
static float ub_exp_minus_square(float ax) {
    const float split = ax * 4097.0f; /* ax = hi + lo, hi with 12 bits: hi * hi is exact */
    const float hi = split - (split - ax), lo = ax - hi;
    const float x2 = ax * ax;
    const float x2_lo = ((hi * hi - x2) + 2.0f * hi * lo) + lo * lo;
    return expf(-x2) * (1.0f - x2_lo);
}

/* |x| < 1.5: erf x = 2/sqrt(pi) e^(-x^2) sum_n 2^n x^(2n+1) / (1*3*...*(2n+1)); every term is
 * positive, so float sums it without the cancellation of erf's own alternating series.
 * |x| >= 1.2: erf x = 1 - erfc x, erfc x = e^(-x^2) / (sqrt(pi) F), F the continued fraction
 * x + (1/2)/(x + 1/(x + (3/2)/(x + ...))) evaluated from 40 terms up (erfc to 1e-9 absolute
 * there). Beyond |x| = 3.92, erf rounds to +-1. */
float erff(float x) {
    if (x != x) return x;
    const float ax = fabsf(x);
    if (ax >= 3.92f) return x < 0.0f ? -1.0f : 1.0f;
    if (ax < 2.44140625e-4f) return x * 1.12837916709551257f; /* 2^-12: the x^3 term rounds away */
    float r;
    if (ax < 1.2f) {
        const float two_x2 = 2.0f * ax * ax;
        float term = ax, sum = ax;
        for (int n = 1; n < 40 && term > sum * 1.0e-9f; ++n) {
            term *= two_x2 / (float)(2 * n + 1);
            sum += term;
        }
        r = 1.12837916709551257f * ub_exp_minus_square(ax) * sum;
    } else {
        float f = ax;
        for (int n = 40; n >= 1; --n) f = ax + (0.5f * (float)n) / f;
        r = 1.0f - ub_exp_minus_square(ax) / (1.77245385090551603f * f);
    }
    return x < 0.0f ? -r : r;
}

/* ---- sine and cosine ---------------------------------------------------------------------- */
/* x = k pi/2 + r with |r| <= pi/4: pi/2 in three parts (Cody and Waite), the first two short
 * enough that k times them is exact for |k| < 2^12 (|x| below about 6400); beyond, the
 * reduction loses bits as k grows. Then the Taylor polynomials of sin and cos on r. */
static const float PIO2_1 = 1.5703125f;              /* 8 significant bits */
static const float PIO2_2 = 4.838705062866211e-4f;  /* the next 12 bits */
static const float PIO2_3 = -4.371138828673793e-8f;  /* the rest, rounded */
static const float TWO_OVER_PI = 6.36619772367581343e-1f;

static float ub_sin_poly(float r) {
    const float z = r * r;
    float p = -1.0f / 39916800.0f;
    p = p * z + 1.0f / 362880.0f;
    p = p * z - 1.0f / 5040.0f;
    p = p * z + 1.0f / 120.0f;
    p = p * z - 1.0f / 6.0f;
    return r + r * z * p;
}

static float ub_cos_poly(float r) {
    const float z = r * r;
    float p = 1.0f / 479001600.0f;
    p = p * z - 1.0f / 3628800.0f;
    p = p * z + 1.0f / 40320.0f;
    p = p * z - 1.0f / 720.0f;
    p = p * z + 1.0f / 24.0f;
    return (1.0f - 0.5f * z) + z * z * p;
}

/* sin (quadrant 0) or cos (quadrant 1) of x */
static float ub_sincos(float x, int32_t quadrant) {
    if (x != x || isinf(x)) return NAN;
    const float kf = nearbyintf(x * TWO_OVER_PI);
    const float r = ((x - kf * PIO2_1) - kf * PIO2_2) - kf * PIO2_3;
    const uint32_t k = (uint32_t)((int32_t)kf + quadrant) & 3u;
    switch (k) {
    case 0: return ub_sin_poly(r);
    case 1: return ub_cos_poly(r);
    case 2: return -ub_sin_poly(r);
    default: return -ub_cos_poly(r);
    }
}

float sinf(float x) { return ub_sincos(x, 0); }
float cosf(float x) { return ub_sincos(x, 1); }

/* ---- remainder of a division -------------------------------------------------------------- */
/* fmod(x, y) = x - trunc(x / y) y, which float represents exactly: the mantissas' long
 * division, keeping the remainder, one exponent step at a time. */
float fmodf(float x, float y) {
    const uint32_t ux = as_u(x), uy = as_u(y);
    const uint32_t sign = ux & 0x80000000u;
    const uint32_t ax = ux & 0x7fffffffu, ay = uy & 0x7fffffffu;
    if (ax >= 0x7f800000u || ay > 0x7f800000u || ay == 0) return NAN; /* x inf/NaN, y NaN/0 */
    if (ax < ay) return x;
    if (ax == ay) return as_f(sign);
    int32_t ex, ey;
    uint32_t mx = ub_unpack(ax, &ex), my = ub_unpack(ay, &ey);
    for (; ex > ey; --ex) { /* mx < 2 my throughout */
        if (mx >= my) mx -= my;
        mx <<= 1;
    }
    if (mx >= my) mx -= my;
    if (mx == 0) return as_f(sign);
    while (mx < 0x800000u) { /* normalise; below exponent 1 the result is subnormal */
        mx <<= 1;
        --ey;
    }
    if (ey >= 1) return as_f(sign | ((uint32_t)ey << 23) | (mx & 0x7fffffu));
    return as_f(sign | (mx >> (1 - ey)));
}
