/* ubitrain runtime: RNG, dropout masks and the loss check. */
#include "ub_runtime.h"

#include <math.h>

uint64_t ub_rng_next(uint64_t *state) {
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

void ub_dropout_mask(uint64_t *state, float *mask, size_t n, float p, float scale) {
    for (size_t i = 0; i < n; ++i) {
        /* 24 random bits give a uniform float in [0, 1) exactly. */
        const float u = (float)(ub_rng_next(state) >> 40) * (1.0f / 16777216.0f);
        mask[i] = u < p ? 0.0f : scale;
    }
}

int32_t ub_check_loss(const float *loss) {
    return isfinite(*loss) ? UB_OK : UB_ERR_NONFINITE_LOSS;
}
