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
/* Floyd's algorithm: a uniform d-subset of [0, n) per row; invert marks its complement.
   Position t, or j when t is taken, selected without a branch (taken is a coin flip near
   d = n/2, which a branch would mispredict). */
void mcln_sample(uint8_t *m, int64_t r0, int64_t r1, int64_t n, int64_t d, int invert,
                 uint64_t key) {
    for (int64_t r = r0; r < r1; ++r) {
        uint8_t *mr = m + r * n;
        uint64_t s = mix64(key ^ mix64((uint64_t)r + 0x632BE59BD9B4E019ULL));
        memset(mr, 0, (size_t)n);
        int64_t j = n - d;
        for (; j + 1 < n; j += 2) {
            uint64_t u = next64(&s);
            int64_t t = bounded((uint32_t)u, (uint32_t)(j + 1), &s);
            mr[t ^ ((t ^ j) & -(int64_t)mr[t])] = 1;
            t = bounded((uint32_t)(u >> 32), (uint32_t)(j + 2), &s);
            mr[t ^ ((t ^ (j + 1)) & -(int64_t)mr[t])] = 1;
        }
        if (j < n) {
            int64_t t = bounded((uint32_t)next64(&s), (uint32_t)(j + 1), &s);
            mr[t ^ ((t ^ j) & -(int64_t)mr[t])] = 1;
        }
        if (invert) for (int64_t i = 0; i < n; ++i) mr[i] ^= 1;
    }
}
#define DEFINE(T, SUF)                                                                       \
void mcln_fwd_##SUF(const T *x, const T *w0, const T *b0, T *y, uint8_t *m, T *mean,        \
                    T *rstd, int64_t r0, int64_t r1, int64_t n, int64_t g, int64_t k,         \
                    int64_t d, int invert, double eps, uint64_t key) {                        \
    mcln_sample(m, r0, r1, n, d, invert, key);                                                \
    for (int64_t r = r0; r < r1; ++r) {                                                       \
        const T *xr = x + r * n; T *yr = y + r * n; const uint8_t *mr = m + r * n;          \
        /* row r = sample * g + group: the group's affine pair */                             \
        const T *w = w0 ? w0 + (r % g) * n : 0, *b = b0 ? b0 + (r % g) * n : 0;              \
        T s = 0, v = 0;                                                                       \
        _Pragma("omp simd reduction(+:s)")                                                    \
        for (int64_t i = 0; i < n; ++i) s += xr[i] * (T)mr[i];                                \
        T mu = s / (T)k;                                                                      \
        _Pragma("omp simd reduction(+:v)")                                                    \
        for (int64_t i = 0; i < n; ++i) { T c = (xr[i] - mu) * (T)mr[i]; v += c * c; }       \
        T rs = (T)(1.0 / sqrt((double)v / (double)k + eps));                                  \
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
void mcln_bwd_##SUF(const T *dy, const T *x, const T *w0, const uint8_t *m, const T *mean,   \
                    const T *rstd, T *dx, T *dw0, T *db0, int64_t r0, int64_t r1, int64_t n,  \
                    int64_t g, int64_t k) {                                                   \
    for (int64_t r = r0; r < r1; ++r) {                                                       \
        const T *dyr = dy + r * n, *xr = x + r * n; T *dxr = dx + r * n;                      \
        const int64_t off = (r % g) * n;                                                      \
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
}
DEFINE(float, f32)
DEFINE(double, f64)
