/* Fused MC-LayerNorm for CPU: per-row exact-k uniform subsets, statistics, output, backward.
 * Plain C (no torch headers); compiled and loaded by ctrcal/layers/mcln_kernel.py. */
#include <stdint.h>
#include <string.h>
#include <math.h>

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* wyrand: 64 random bits per 64x64->128 multiply */
static inline uint64_t next64(uint64_t *s) {
    *s += 0xa0761d6478bd642fULL;
    __uint128_t t = (__uint128_t)*s * (*s ^ 0xe7037ed1a0b428dbULL);
    return (uint64_t)(t >> 64) ^ (uint64_t)t;
}
/* exactly uniform integer in [0, n) from 32 random bits, redrawing the biased sliver */
static inline uint32_t bounded(uint32_t u, uint32_t n, uint64_t *s) {
    uint64_t m = (uint64_t)u * n;
    uint32_t l = (uint32_t)m;
    if (l < n) {
        uint32_t t = (uint32_t)(0u - n) % n;
        while (l < t) { m = (uint64_t)(uint32_t)next64(s) * n; l = (uint32_t)m; }
    }
    return (uint32_t)(m >> 32);
}
/* Floyd's algorithm: a uniform d-subset of [0, n) for row r; with invert its complement.
   The row is first filled with `off`, chosen positions get `on`: with invert the d drawn
   positions are the ones left out, so no second pass flips the row. Position t, or j when
   t is taken, is selected without a branch (taken is a coin flip near d = n/2, which a
   branch would mispredict). */
static inline __attribute__((always_inline)) void sample_row(uint8_t *mr, int64_t r, int64_t n, int64_t d, int invert,
                              uint64_t key) {
    uint64_t s = mix64(key ^ mix64((uint64_t)r + 0x632BE59BD9B4E019ULL));
    const uint8_t on = invert ? 0 : 1, flip = invert ? 1 : 0;
    if (n <= 64) {
        /* narrow rows (per-field norms): the same draws, marked in a register and written
           out once; byte stores right before the statistics' vector loads of the same row
           would stall store-to-load forwarding */
        uint64_t bits = 0;
        for (int64_t j = n - d; j < n; ++j) {
            int64_t t = bounded((uint32_t)next64(&s), (uint32_t)(j + 1), &s);
            int64_t taken = (int64_t)((bits >> t) & 1);
            bits |= 1ULL << (t ^ ((t ^ j) & -taken));
        }
        for (int64_t i = 0; i < n; ++i) mr[i] = (uint8_t)(((bits >> i) & 1) ^ flip);
        return;
    }
    memset(mr, flip, (size_t)n);
    int64_t j = n - d;
    for (; j + 1 < n; j += 2) {
        uint64_t u = next64(&s);
        int64_t t = bounded((uint32_t)u, (uint32_t)(j + 1), &s);
        mr[t ^ ((t ^ j) & -(int64_t)(mr[t] ^ flip))] = on;
        t = bounded((uint32_t)(u >> 32), (uint32_t)(j + 2), &s);
        mr[t ^ ((t ^ (j + 1)) & -(int64_t)(mr[t] ^ flip))] = on;
    }
    if (j < n) {
        int64_t t = bounded((uint32_t)next64(&s), (uint32_t)(j + 1), &s);
        mr[t ^ ((t ^ j) & -(int64_t)(mr[t] ^ flip))] = on;
    }
}
void mcln_sample(uint8_t *m, int64_t r0, int64_t r1, int64_t n, int64_t d, int invert,
                 uint64_t key) {
    for (int64_t r = r0; r < r1; ++r) sample_row(m + r * n, r, n, d, invert, key);
}
/* The row functions are inlined into callers that pass common widths as constants, so the
   compiler emits loops of known length for them (per-field embedding norms have D = 8..64:
   a generic loop with its vector remainder handling costs more than the work there). */
#define INLINE static inline __attribute__((always_inline))
#define DEFINE(T, SUF)                                                                       \
INLINE void fwd_rows_##SUF(const T *x, const T *w0, const T *b0, T *y, uint8_t *m, T *mean, \
                    T *rstd, int64_t r0, int64_t r1, const int64_t n, int64_t g, int64_t k,   \
                    int64_t d, int invert, double eps, uint64_t key) {                        \
    /* row r = sample * g + group: the group's affine pair (group counted, not divided) */  \
    int64_t gi = r0 % g;                                                                      \
    for (int64_t r = r0; r < r1; ++r, gi = (gi + 1 == g) ? 0 : gi + 1) {                     \
        const T *xr = x + r * n; T *yr = y + r * n; uint8_t *mr = m + r * n;                \
        /* the row's subset is drawn right before its statistics, while it is in L1 */        \
        sample_row(mr, r, n, d, invert, key);                                                 \
        const T *w = w0 ? w0 + gi * n : 0, *b = b0 ? b0 + gi * n : 0;                        \
        /* one pass for both moments, shifted by the row's first element so that a large */   \
        /* common offset does not cancel: v = sum m(x-c)^2 - (sum m(x-c))^2 / k */            \
        T c0 = xr[0], s = 0, q = 0;                                                           \
        _Pragma("omp simd reduction(+:s,q)")                                                  \
        for (int64_t i = 0; i < n; ++i) { T z = (xr[i] - c0) * (T)mr[i]; s += z; q += z * z; } \
        T ms = s / (T)k, mu = c0 + ms;                                                        \
        double var = (double)q / (double)k - (double)ms * (double)ms;                          \
        if (var < 0) var = 0;                                                                 \
        T rs = (T)(1.0 / sqrt(var + eps));                                                    \
        mean[r] = mu; rstd[r] = rs;                                                           \
        if (w && b) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                    \
            yr[i] = (xr[i] - mu) * rs * w[i] + b[i]; }                                        \
        else if (w) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                    \
            yr[i] = (xr[i] - mu) * rs * w[i]; }                                               \
        else if (b) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                    \
            yr[i] = (xr[i] - mu) * rs + b[i]; }                                               \
        else { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                           \
            yr[i] = (xr[i] - mu) * rs; }                                                      \
    }                                                                                         \
}                                                                                             \
INLINE void bwd_rows_##SUF(const T *dy, const T *x, const T *w0, const uint8_t *m,         \
                    const T *mean, const T *rstd, T *dx, T *dw0, T *db0, int64_t r0,          \
                    int64_t r1, const int64_t n, int64_t g, int64_t k) {                      \
    int64_t gi = r0 % g;                                                                      \
    for (int64_t r = r0; r < r1; ++r, gi = (gi + 1 == g) ? 0 : gi + 1) {                     \
        const T *dyr = dy + r * n, *xr = x + r * n; T *dxr = dx + r * n;                      \
        const int64_t off = gi * n;                                                           \
        const T *w = w0 ? w0 + off : 0; T *dw = dw0 ? dw0 + off : 0, *db = db0 + off;        \
        const uint8_t *mr = m + r * n;                                                        \
        T mu = mean[r], rs = rstd[r], A = 0, B = 0;                                           \
        if (w) {                                                                              \
            _Pragma("omp simd reduction(+:A,B)")                                              \
            for (int64_t i = 0; i < n; ++i) {                                                 \
                T xh = (xr[i] - mu) * rs, g = dyr[i] * w[i];                                  \
                A += g; B += g * xh; dw[i] += dyr[i] * xh; db[i] += dyr[i];                   \
            }                                                                                 \
        } else {                                                                              \
            _Pragma("omp simd reduction(+:A,B)")                                              \
            for (int64_t i = 0; i < n; ++i) {                                                 \
                T xh = (xr[i] - mu) * rs, g = dyr[i];                                         \
                A += g; B += g * xh; db[i] += dyr[i];                                         \
            }                                                                                 \
        }                                                                                     \
        T a = A / (T)k, c = B / (T)k;                                                         \
        if (w) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                         \
            dxr[i] = rs * (dyr[i] * w[i] - (T)mr[i] * (a + c * (xr[i] - mu) * rs)); }        \
        else { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                           \
            dxr[i] = rs * (dyr[i] - (T)mr[i] * (a + c * (xr[i] - mu) * rs)); }               \
    }                                                                                         \
}                                                                                             \
void mcln_fwd_##SUF(const T *x, const T *w, const T *b, T *y, uint8_t *m, T *mean, T *rstd, \
                    int64_t r0, int64_t r1, int64_t n, int64_t g, int64_t k, int64_t d,       \
                    int invert, double eps, uint64_t key) {                                   \
    switch (n) {                                                                              \
    case 8: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, 8, g, k, d, invert, eps, key); \
        break;                                                                                \
    case 16: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, 16, g, k, d, invert, eps, key); \
        break;                                                                                \
    case 32: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, 32, g, k, d, invert, eps, key); \
        break;                                                                                \
    default: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, n, g, k, d, invert, eps, key); \
    }                                                                                         \
}                                                                                             \
void mcln_bwd_##SUF(const T *dy, const T *x, const T *w, const uint8_t *m, const T *mean,    \
                    const T *rstd, T *dx, T *dw, T *db, int64_t r0, int64_t r1, int64_t n,    \
                    int64_t g, int64_t k) {                                                   \
    switch (n) {                                                                              \
    case 8: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, 8, g, k); break;     \
    case 16: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, 16, g, k); break;   \
    case 32: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, 32, g, k); break;   \
    default: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, n, g, k);           \
    }                                                                                         \
}
DEFINE(float, f32)
DEFINE(double, f64)
