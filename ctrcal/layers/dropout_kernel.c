/* Fused ReLU + inverted dropout on the CPU: one pass forward, one pass backward.
 *
 * Element i (flat index) is kept when the high 32 bits of mix64(key + (i + 1) * GOLDEN) are
 * below `threshold` (= round((1 - p) * 2^32)): SplitMix64's output function on its own
 * counter sequence, so every element's draw is a pure function of (key, i) -- any split of the
 * elements between threads gives the same mask, and the loops vectorise (no state carried
 * from one element to the next). ctrcal/layers/dropout.py holds the same function in torch
 * (the fallback, and the reference the tests compare with).
 */
#include <stdint.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline int kept(uint64_t key, int64_t i, uint64_t threshold) {
    return (mix64(key + (uint64_t)(i + 1) * GOLDEN) >> 32) < threshold;
}

/* y[i] = x[i] * scale where element i is kept and x[i] > 0 (NaN passes, as in ReLU), else 0,
 * for i in [i0, i1). */
void relu_dropout_fwd_f32(const float *x, float *y, int64_t i0, int64_t i1, uint64_t key,
                          uint64_t threshold, float scale) {
    for (int64_t i = i0; i < i1; ++i) {
        float v = x[i];
        y[i] = (kept(key, i, threshold) && !(v <= 0.0f)) ? v * scale : 0.0f;
    }
}

void relu_dropout_fwd_f64(const double *x, double *y, int64_t i0, int64_t i1, uint64_t key,
                          uint64_t threshold, double scale) {
    for (int64_t i = i0; i < i1; ++i) {
        double v = x[i];
        y[i] = (kept(key, i, threshold) && !(v <= 0.0)) ? v * scale : 0.0;
    }
}

/* dx[i] = g[i] * scale where the output y[i] is not <= 0 (kept and positive), else 0. */
void relu_dropout_bwd_f32(const float *g, const float *y, float *dx, int64_t i0, int64_t i1,
                          float scale) {
    for (int64_t i = i0; i < i1; ++i) dx[i] = !(y[i] <= 0.0f) ? g[i] * scale : 0.0f;
}

void relu_dropout_bwd_f64(const double *g, const double *y, double *dx, int64_t i0, int64_t i1,
                          double scale) {
    for (int64_t i = i0; i < i1; ++i) dx[i] = !(y[i] <= 0.0) ? g[i] * scale : 0.0;
}

/* keep[i] = 1 where element i is kept, for i in [i0, i1). */
void dropout_keep_mask(uint8_t *keep, int64_t i0, int64_t i1, uint64_t key, uint64_t threshold) {
    for (int64_t i = i0; i < i1; ++i) keep[i] = (uint8_t)kept(key, i, threshold);
}
