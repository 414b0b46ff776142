/* Fused MC-LayerNorm for CPU: per-row exact-k uniform subsets, statistics, output, backward.
 * Plain C (no torch headers); compiled and loaded by ctrcal/layers/kernels/mcln_kernel.py.
 *
 * A row's subset is kept as the list of the d = min(k, N - k) positions Floyd's algorithm
 * draws (with `invert`, the N - k positions left out), never as an N-wide mask: the
 * statistics are a plain pass over the row corrected on those d positions, and the backward
 * writes the plain formula for every element and rewrites the d positions with the other
 * one. The row loops stay the ones of LayerNorm (no mask to load, convert and multiply).
 *
 * The exported functions at the end run the row functions over chunks of rows, by the
 * convention of chunks.h; a nonzero return means a chunk could not allocate its scratch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "chunks.h"

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
#define GAMMA 0x9E3779B97F4A7C15ULL
/* wyrand: only for the rare redraws of the exact bounded integers below */
static inline uint64_t next64(uint64_t *s) {
    *s += 0xa0761d6478bd642fULL;
    __uint128_t t = (__uint128_t)*s * (*s ^ 0xe7037ed1a0b428dbULL);
    return (uint64_t)(t >> 64) ^ (uint64_t)t;
}
static inline uint64_t row_seed(uint64_t key, int64_t r) {
    return mix64(key ^ mix64((uint64_t)r + 0x632BE59BD9B4E019ULL));
}
/* Lemire's exact bounded integer: u * m / 2^32 unless the low word falls in the biased
   sliver (below 2^32 mod m), then redraw from a stream of its own */
static uint32_t redraw(uint32_t u, uint32_t m, uint64_t seed, int64_t i) {
    uint64_t p = (uint64_t)u * m;
    uint32_t t = (uint32_t)(0u - m) % m;
    uint64_t s = seed ^ mix64((uint64_t)i + 0x2545F4914F6CDD1DULL);
    while ((uint32_t)p < t) p = (uint64_t)(uint32_t)next64(&s) * m;
    return (uint32_t)(p >> 32);
}
/* Floyd's algorithm: a uniform d-subset of [0, n) for row r, as d distinct positions.
   Draw i is uniform in [0, n - d + i]: the d draws are SplitMix64 outputs of the row's seed
   (independent of each other, so this loop vectorises); only the membership test (take t,
   or the new top position j when t is already taken) is sequential. */
static inline __attribute__((always_inline)) void draw_row(int32_t *idx, uint32_t *tt,
                                                          uint64_t *bits, int64_t r, int64_t n,
                                                          int64_t d, uint64_t key) {
    const uint64_t seed = row_seed(key, r);
    const uint32_t base = (uint32_t)(n - d) + 1;
    uint32_t suspect = 0;
    _Pragma("omp simd reduction(|:suspect)")
    for (int64_t i = 0; i < d; ++i) {
        uint32_t u = (uint32_t)(mix64(seed + (uint64_t)(i + 1) * GAMMA) >> 32);
        uint32_t m = base + (uint32_t)i;
        uint64_t p = (uint64_t)u * m;
        tt[i] = (uint32_t)(p >> 32);
        suspect |= (uint32_t)((uint32_t)p < m);
    }
    if (suspect) { /* probability below d * n / 2^32 per row */
        for (int64_t i = 0; i < d; ++i) {
            uint32_t u = (uint32_t)(mix64(seed + (uint64_t)(i + 1) * GAMMA) >> 32);
            tt[i] = redraw(u, base + (uint32_t)i, seed, i);
        }
    }
    if (n <= 64) {
        uint64_t b = 0;
        for (int64_t i = 0; i < d; ++i) {
            uint64_t t = tt[i], j = (uint64_t)(n - d + i);
            uint64_t p = ((b >> t) & 1) ? j : t;
            b |= 1ULL << p;
            idx[i] = (int32_t)p;
        }
        return;
    }
    /* Wide rows: the subset as bytes. Both stores take their address from the draws alone
       (j gets the taken flag, t is set whether or not it was in already), never from the
       loaded byte, so later loads need not wait for a store address. */
    uint8_t *mr = (uint8_t *)bits;
    memset(mr, 0, (size_t)n);
    for (int64_t i = 0; i < d; ++i) {
        const uint64_t t = tt[i], j = (uint64_t)(n - d + i);
        const uint8_t taken = mr[t];
        mr[j] = taken;
        mr[t] = 1; /* after j's store: t == j (drawn the top itself) leaves it set */
        idx[i] = (int32_t)(t ^ ((t ^ j) & (0 - (uint64_t)taken)));
    }
}
/* scratch of one call: d draws and n bytes (heap only for very wide rows) */
typedef struct { uint32_t *tt; uint64_t *bits; void *heap; uint32_t tt0[512]; uint64_t b0[128]; } scratch_t;
static int scratch_init(scratch_t *s, int64_t n, int64_t d) {
    const int64_t words = (n + 7) / 8;
    s->heap = 0; s->tt = s->tt0; s->bits = s->b0;
    if (d <= 512 && words <= 128) return 0;
    s->heap = malloc((size_t)d * sizeof(uint32_t) + (size_t)words * sizeof(uint64_t));
    if (!s->heap) return -1;
    s->bits = (uint64_t *)s->heap;
    s->tt = (uint32_t *)(s->bits + words);
    return 0;
}
static void scratch_free(scratch_t *s) { free(s->heap); }

/* the subsets of rows r0..r1 as a 0/1 mask [R, n] (the positions drawn are the ones left out
   with invert) */
static int mcln_sample_range(uint8_t *m, int64_t r0, int64_t r1, int64_t n, int64_t d,
                             int invert, uint64_t key) {
    scratch_t s;
    if (scratch_init(&s, n, d)) return -1;
    int32_t *idx = (int32_t *)malloc((size_t)(d > 0 ? d : 1) * sizeof(int32_t));
    if (!idx) { scratch_free(&s); return -1; }
    for (int64_t r = r0; r < r1; ++r) {
        uint8_t *mr = m + r * n;
        draw_row(idx, s.tt, s.bits, r, n, d, key);
        memset(mr, invert ? 1 : 0, (size_t)n);
        for (int64_t i = 0; i < d; ++i) mr[idx[i]] = invert ? 0 : 1;
    }
    free(idx);
    scratch_free(&s);
    return 0;
}
/* The row functions are inlined into callers that pass common widths as constants, so the
   compiler emits loops of known length for them (per-field embedding norms have D = 8..64:
   a generic loop with its vector remainder handling costs more than the work there). */
/* Storage and arithmetic: f32 and f64 rows are stored as they compute; bf16 rows (the bits of
   a bfloat16) are widened to float on load and rounded to nearest even on store, so a bf16
   row's statistics, output and gradients are the float32 kernel's on the widened row, rounded
   once. The affine parameters, their gradients and the row statistics are float32. */
#define LD_f32(v) (v)
#define ST_f32(v) (v)
#define LD_f64(v) (v)
#define ST_f64(v) (v)
static inline float LD_bf16(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint16_t ST_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#define INLINE static inline __attribute__((always_inline))
#define DEFINE(S, T, SUF)                                                                       \
/* sum and sum of squares of x - c over the d positions: in vector lanes when there are     \
   many (a scalar sum waits on every addition), plainly for the few of narrow rows */       \
INLINE void gather_moments_##SUF(const S *xr, const int32_t *idx, int64_t d, T c, T *s, T *q) { \
    T se = 0, qe = 0;                                                                         \
    if (d >= 16) {                                                                            \
        _Pragma("omp simd reduction(+:se,qe)")                                                \
        for (int64_t i = 0; i < d; ++i) { T z = LD_##SUF(xr[idx[i]]) - c; se += z; qe += z * z; }     \
    } else {                                                                                  \
        for (int64_t i = 0; i < d; ++i) { T z = LD_##SUF(xr[idx[i]]) - c; se += z; qe += z * z; }     \
    }                                                                                         \
    *s = se; *q = qe;                                                                         \
}                                                                                             \
INLINE void fwd_rows_##SUF(const S *x, const T *w0, const T *b0, S *y, int32_t *idx0,       \
                    T *mean, T *rstd, int64_t r0, int64_t r1, const int64_t n, int64_t g,     \
                    int64_t k, int64_t d, int invert, double eps, uint64_t key,               \
                    scratch_t *sc) {                                                          \
    /* row r = sample * g + group: the group's affine pair (group counted, not divided) */  \
    int64_t gi = r0 % g;                                                                      \
    for (int64_t r = r0; r < r1; ++r, gi = (gi + 1 == g) ? 0 : gi + 1) {                     \
        const S *xr = x + r * n; S *yr = y + r * n; int32_t *idx = idx0 + r * d;            \
        draw_row(idx, sc->tt, sc->bits, r, n, d, key);                                        \
        const T *w = w0 ? w0 + gi * n : 0, *b = b0 ? b0 + gi * n : 0;                        \
        /* both moments in one pass, shifted by the row's first element so that a large */   \
        /* common offset does not cancel: v = sum_S (x-c)^2 / k - (sum_S (x-c) / k)^2; with */\
        /* invert, sum_S = (sum over the row) - (sum over the d positions left out) */       \
        const T c0 = LD_##SUF(xr[0]);                                                                   \
        double s = 0, q = 0;                                                                  \
        if (invert) {                                                                         \
            T sa = 0, qa = 0;                                                                 \
            _Pragma("omp simd reduction(+:sa,qa)")                                            \
            for (int64_t i = 0; i < n; ++i) { T z = LD_##SUF(xr[i]) - c0; sa += z; qa += z * z; }      \
            s = sa; q = qa;                                                                   \
            T se, qe; gather_moments_##SUF(xr, idx, d, c0, &se, &qe);                        \
            s -= se; q -= qe;                                                                 \
        } else {                                                                              \
            T se, qe; gather_moments_##SUF(xr, idx, d, c0, &se, &qe);                        \
            s = se; q = qe;                                                                   \
        }                                                                                     \
        double ms = s / (double)k;                                                            \
        double var = q / (double)k - ms * ms;                                                 \
        if (var < 0) var = 0;                                                                 \
        T mu = (T)((double)c0 + ms), rs = (T)(1.0 / sqrt(var + eps));                         \
        mean[r] = mu; rstd[r] = rs;                                                           \
        if (w && b) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                    \
            yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs * w[i] + b[i]); }                                        \
        else if (w) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                    \
            yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs * w[i]); }                                               \
        else if (b) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                    \
            yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs + b[i]); }                                               \
        else { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                           \
            yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs); }                                                      \
    }                                                                                         \
}                                                                                             \
/* dx = rs (g - [i in S] (a + c xhat)) with a = sum(g) / k, c = sum(g xhat) / k over the whole     \
   row: the formula of the majority for every element, then the d drawn positions rewritten        \
   with the other one */                                                                           \
INLINE void dx_row_##SUF(const S *dyr, const S *xr, const T *w, const int32_t *idx, S *dxr,        \
                         const int64_t n, T mu, T rs, T A, T B, int64_t k, int64_t d,              \
                         int invert) {                                                             \
    const T one = 1, a = A / (T)k, c = B / (T)k, on = invert ? one : 0, off = invert ? 0 : one;    \
    if (w) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                                   \
        dxr[i] = ST_##SUF(rs * (LD_##SUF(dyr[i]) * w[i] - on * (a + c * (LD_##SUF(xr[i]) - mu) * rs))); }                        \
    else { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                                     \
        dxr[i] = ST_##SUF(rs * (LD_##SUF(dyr[i]) - on * (a + c * (LD_##SUF(xr[i]) - mu) * rs))); }                               \
    for (int64_t i = 0; i < d; ++i) {                                                              \
        const int64_t p = idx[i];                                                                  \
        dxr[p] = ST_##SUF(rs * (LD_##SUF(dyr[p]) * (w ? w[p] : one) - off * (a + c * (LD_##SUF(xr[p]) - mu) * rs)));             \
    }                                                                                              \
}                                                                                                  \
INLINE void bwd_rows_##SUF(const S *dy, const S *x, const T *w0, const int32_t *idx0,              \
                    const T *mean, const T *rstd, S *dx, T *dw0, T *db0, int64_t r0,               \
                    int64_t r1, const int64_t n, int64_t g, int64_t k, int64_t d,                  \
                    int invert) {                                                                  \
    int64_t r = r0, gi = r0 % g;                                                                   \
    for (; r < r1; ++r, gi = (gi + 1 == g) ? 0 : gi + 1) {                                         \
        const S *dyr = dy + r * n, *xr = x + r * n;                                                \
        const int64_t off = gi * n;                                                                \
        const T *w = w0 ? w0 + off : 0; T *dw = dw0 ? dw0 + off : 0, *db = db0 + off;              \
        T mu = mean[r], rs = rstd[r], A = 0, B = 0;                                                \
        if (w) {                                                                                   \
            _Pragma("omp simd reduction(+:A,B)")                                                   \
            for (int64_t i = 0; i < n; ++i) {                                                      \
                T xh = (LD_##SUF(xr[i]) - mu) * rs, dyi = LD_##SUF(dyr[i]), gy = dyi * w[i];                                      \
                A += gy; B += gy * xh; dw[i] += dyi * xh; db[i] += dyi;                      \
            }                                                                                      \
        } else {                                                                                   \
            _Pragma("omp simd reduction(+:A,B)")                                                   \
            for (int64_t i = 0; i < n; ++i) {                                                      \
                T xh = (LD_##SUF(xr[i]) - mu) * rs, dyi = LD_##SUF(dyr[i]);                        \
                A += dyi; B += dyi * xh; db[i] += dyi;                                             \
            }                                                                                      \
        }                                                                                          \
        dx_row_##SUF(dyr, xr, w, idx0 + r * d, dx + r * n, n, mu, rs, A, B, k, d, invert);         \
    }                                                                                              \
}                                                                                                  \
static int mcln_fwd_range_##SUF(const S *x, const T *w, const T *b, S *y, int32_t *idx, T *mean, T *rstd, \
                   int64_t r0, int64_t r1, int64_t n, int64_t g, int64_t k, int64_t d,        \
                   int invert, double eps, uint64_t key) {                                    \
    scratch_t sc;                                                                             \
    if (scratch_init(&sc, n, d)) return -1;                                                   \
    switch (n) {                                                                              \
    case 8: fwd_rows_##SUF(x, w, b, y, idx, mean, rstd, r0, r1, 8, g, k, d, invert, eps, key, &sc); \
        break;                                                                                \
    case 16: fwd_rows_##SUF(x, w, b, y, idx, mean, rstd, r0, r1, 16, g, k, d, invert, eps, key, &sc); \
        break;                                                                                \
    case 32: fwd_rows_##SUF(x, w, b, y, idx, mean, rstd, r0, r1, 32, g, k, d, invert, eps, key, &sc); \
        break;                                                                                \
    default: fwd_rows_##SUF(x, w, b, y, idx, mean, rstd, r0, r1, n, g, k, d, invert, eps, key, &sc); \
    }                                                                                         \
    scratch_free(&sc);                                                                        \
    return 0;                                                                                 \
}                                                                                             \
static void mcln_bwd_range_##SUF(const S *dy, const S *x, const T *w, const int32_t *idx, const T *mean,  \
                    const T *rstd, S *dx, T *dw, T *db, int64_t r0, int64_t r1, int64_t n,    \
                    int64_t g, int64_t k, int64_t d, int invert) {                            \
    switch (n) {                                                                              \
    case 8: bwd_rows_##SUF(dy, x, w, idx, mean, rstd, dx, dw, db, r0, r1, 8, g, k, d, invert); \
        break;                                                                                \
    case 16: bwd_rows_##SUF(dy, x, w, idx, mean, rstd, dx, dw, db, r0, r1, 16, g, k, d, invert); \
        break;                                                                                \
    case 32: bwd_rows_##SUF(dy, x, w, idx, mean, rstd, dx, dw, db, r0, r1, 32, g, k, d, invert); \
        break;                                                                                \
    default: bwd_rows_##SUF(dy, x, w, idx, mean, rstd, dx, dw, db, r0, r1, n, g, k, d, invert); \
    }                                                                                         \
}
DEFINE(float, float, f32)
DEFINE(double, double, f64)
DEFINE(uint16_t, float, bf16)

/* ---- The exported kernels: the functions above over chunks of rows ---- */

/* The subsets of the rows as a 0/1 mask [R, n] (see mcln_sample_range). */
int mcln_sample(uint8_t *m, int64_t n, int64_t d, int invert, uint64_t key, CHUNKS) {
    int failed = 0;
    FOR_EACH_CHUNK_WITH(reduction(| : failed),
                        failed |= mcln_sample_range(m, lo, hi, n, d, invert, key));
    return failed;
}

/* dw (NULL: no weight), db: [chunks, g, n] partial sums. */
#define DEFINE_CHUNKED(S, T, SUF)                                                             \
int mcln_fwd_##SUF(const S *x, const T *w, const T *b, S *y, int32_t *idx, T *mean, T *rstd,  \
                   int64_t n, int64_t g, int64_t k, int64_t d, int invert, double eps,        \
                   uint64_t key, CHUNKS) {                                                    \
    int failed = 0;                                                                           \
    FOR_EACH_CHUNK_WITH(reduction(| : failed),                                                \
                        failed |= mcln_fwd_range_##SUF(x, w, b, y, idx, mean, rstd, lo, hi, n, \
                                                       g, k, d, invert, eps, key));           \
    return failed;                                                                            \
}                                                                                             \
void mcln_bwd_##SUF(const S *dy, const S *x, const T *w, const int32_t *idx, const T *mean,  \
                    const T *rstd, S *dx, T *dw, T *db, int64_t n, int64_t g, int64_t k,      \
                    int64_t d, int invert, CHUNKS) {                                          \
    FOR_EACH_CHUNK(mcln_bwd_range_##SUF(dy, x, w, idx, mean, rstd, dx, dw ? dw + c * g * n : 0, \
                                        db + c * g * n, lo, hi, n, g, k, d, invert));          \
}
DEFINE_CHUNKED(float, float, f32)
DEFINE_CHUNKED(double, double, f64)
DEFINE_CHUNKED(uint16_t, float, bf16)
