/* Fused MC-LayerNorm for CPU: per-row exact-k uniform subsets, statistics, output, backward.
 * Plain C (no torch headers); compiled and loaded by ctrcal/layers/kernels/mcln_kernel.py.
 *
 * A row's subset is a bitmask of ceil(N / 64) words (bit i: feature i is in the subset),
 * saved by the forward for the backward. The statistics are one pass over the row that adds
 * up the masked elements; the backward's second pass applies the subset term where the mask
 * says. With AVX-512 (this machine's build, see cbuild) the row loops take 16 floats at a time
 * and the mask's 16 bits as the vector mask; elsewhere plain C loops.
 *
 * The draw of a row (exactly k of N, uniform over all subsets):
 * - N <= 64: Floyd's algorithm draws the d = min(k, N - k) positions of the smaller side into
 *   one word (the complement taken when k > N/2);
 * - wider rows: each feature is kept independently when its 16 random bits fall below
 *   floor(k * 2^16 / N); the c features kept are then corrected to exactly k by removing c - k
 *   of them (or adding k - c of the others), each a uniform pick among those left. The first
 *   step treats every feature alike (exchangeable) and the second step does not depend on the
 *   positions' order, so the result is the same for every permutation of the features: uniform
 *   over the C(N, k) subsets. About sqrt(N k (N - k)) / N picks a row instead of min(k, N - k)
 *   sequential membership tests.
 * All random bits are SplitMix64 outputs of a per-row seed (one torch draw, the row index),
 * so the subsets do not depend on the thread count; every bounded pick is exact (Lemire's
 * multiply-and-reject).
 *
 * The exported functions at the end run the row functions over chunks of rows, by the
 * convention of chunks.h; a nonzero return means a chunk could not allocate its scratch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define MCLN_AVX512 1
#elif defined(__BMI2__)
#include <immintrin.h>
#endif

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
/* draw i of a row's stream `seed`, uniform in [0, m) */
static inline uint32_t bounded(uint64_t seed, int64_t i, uint32_t m) {
    uint32_t u = (uint32_t)(mix64(seed + (uint64_t)(i + 1) * GAMMA) >> 32);
    uint64_t p = (uint64_t)u * m;
    if ((uint32_t)p < m) return redraw(u, m, seed, i); /* rare: exact check */
    return (uint32_t)(p >> 32);
}
static inline uint64_t low_bits(int64_t n) { return n >= 64 ? ~0ULL : (1ULL << n) - 1; }
/* the position of the r-th (from 0) set bit of x (r < popcount(x)) */
static inline int select64(uint64_t x, uint32_t r) {
#ifdef __BMI2__
    return __builtin_ctzll(_pdep_u64(1ULL << r, x));
#else
    for (; r; --r) x &= x - 1;
    return __builtin_ctzll(x);
#endif
}
static inline uint64_t pdep64(uint64_t src, uint64_t mask) {
#ifdef __BMI2__
    return _pdep_u64(src, mask);
#else
    uint64_t out = 0;
    for (; mask; mask &= mask - 1, src >>= 1) out |= (src & 1) ? mask & (0 - mask) : 0;
    return out;
#endif
}
/* bits [p, p + len) of the multiword r (len <= 64; r has a zero word past its end) */
static inline uint64_t extract_bits(const uint64_t *r, int64_t p, int64_t len) {
    const int64_t o = p & 63;
    uint64_t v = r[p >> 6] >> o;
    if (o) v |= r[(p >> 6) + 1] << (64 - o);
    return v & low_bits(len);
}
/* bit e set where byte e of x is below thr (eight unsigned comparisons in one word) */
static inline uint64_t bytes_below(uint64_t x, uint8_t thr) {
    const uint64_t hi = 0x8080808080808080ULL, one = 0x0101010101010101ULL;
    const uint64_t t = one * thr, tl = t & ~hi, xl = x & ~hi;
    const uint64_t low = ((tl | hi) - (xl + one)) & hi; /* low 7 bits of x below thr's */
    const uint64_t f = (thr & 0x80) ? (~x & hi) | low : ~x & hi & low;
    return ((f >> 7) * 0x0102040810204080ULL) >> 56;
}
/* Floyd's algorithm in rank space: e distinct ranks of [0, m) set in r (zeroed, e <= m),
   uniform over the e-subsets; draw i is uniform in [0, m - e + i], from stream `seed`. */
#if defined(MCLN_AVX512) && defined(__AVX512DQ__)
#define RANK_BATCH 24
/* draws 0..23 of floyd_ranks in vector lanes, each as bounded() computes it unless its low
   word falls in the sliver bounded() checks: returns nonzero when one of the first e does */
static inline int rank_draws(uint32_t *tt, uint64_t seed, int64_t m, int64_t e) {
    const __m512i m1 = _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL);
    const __m512i m2 = _mm512_set1_epi64((long long)0x94D049BB133111EBULL);
    const __m512i low = _mm512_set1_epi64(0xffffffffLL);
    int bad = 0;
    for (int v = 0; v < RANK_BATCH / 8; ++v) {
        const __m512i i1 = _mm512_add_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1),
                                            _mm512_set1_epi64(8 * v)); /* i + 1 */
        __m512i z = _mm512_add_epi64(_mm512_set1_epi64((long long)seed),
                                     _mm512_mullo_epi64(i1, _mm512_set1_epi64((long long)GAMMA)));
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), m1);
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
        z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
        const __m512i bound = _mm512_add_epi64(i1, _mm512_set1_epi64(m - e)); /* m - e + i + 1 */
        const __m512i p = _mm512_mul_epu32(_mm512_srli_epi64(z, 32), bound);
        const int64_t left = e - 8 * v;
        const __mmask8 lanes = left >= 8 ? 0xff : left <= 0 ? 0 : (__mmask8)((1u << left) - 1);
        bad |= (int)_mm512_mask_cmplt_epu64_mask(lanes, _mm512_and_si512(p, low), bound);
        _mm256_storeu_si256((__m256i *)(tt + 8 * v), _mm512_cvtepi64_epi32(_mm512_srli_epi64(p, 32)));
    }
    return bad;
}
#endif
static void floyd_ranks(uint64_t *r, int64_t words, uint64_t seed, int64_t m, int64_t e) {
    uint32_t tt[64];
    memset(r, 0, (size_t)words * sizeof(uint64_t));
#ifdef RANK_BATCH
    if (e <= RANK_BATCH) { /* most rows: the draws in vector lanes, a loop of e steps */
        if (rank_draws(tt, seed, m, e))
            for (int64_t i = 0; i < e; ++i) tt[i] = bounded(seed, i, (uint32_t)(m - e + i) + 1);
        for (int64_t i = 0; i < e; ++i) {
            const uint64_t j = (uint64_t)(m - e + i), t = tt[i];
            const uint64_t p = ((r[t >> 6] >> (t & 63)) & 1) ? j : t;
            r[p >> 6] |= 1ULL << (p & 63);
        }
        return;
    }
#endif
    for (int64_t i0 = 0; i0 < e; i0 += 64) {
        const int64_t i1 = e - i0 < 64 ? e : i0 + 64;
        uint32_t suspect = 0;
        _Pragma("omp simd reduction(|:suspect)")
        for (int64_t i = i0; i < i1; ++i) { /* the draws, as in bounded(), in vector lanes */
            const uint32_t u = (uint32_t)(mix64(seed + (uint64_t)(i + 1) * GAMMA) >> 32);
            const uint32_t b = (uint32_t)(m - e + i) + 1;
            const uint64_t p = (uint64_t)u * b;
            tt[i - i0] = (uint32_t)(p >> 32);
            suspect |= (uint32_t)((uint32_t)p < b);
        }
        if (suspect)
            for (int64_t i = i0; i < i1; ++i) tt[i - i0] = bounded(seed, i, (uint32_t)(m - e + i) + 1);
        for (int64_t i = i0; i < i1; ++i) {
            const uint64_t j = (uint64_t)(m - e + i), t = tt[i - i0];
            const uint64_t p = ((r[t >> 6] >> (t & 63)) & 1) ? j : t;
            r[p >> 6] |= 1ULL << (p & 63);
        }
    }
}

/* Floyd's algorithm for rows of at most 64: a uniform d-subset of [0, n) as a word. Draw i is
   uniform in [0, n - d + i]; only the membership test is sequential. */
static inline uint64_t floyd_word(uint32_t *tt, uint64_t seed, int64_t n, int64_t d) {
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
    uint64_t b = 0;
    for (int64_t i = 0; i < d; ++i) {
        uint64_t t = tt[i], j = (uint64_t)(n - d + i);
        b |= 1ULL << (((b >> t) & 1) ? j : t);
    }
    return b;
}
/* scratch of one call: the random words of a row (heap only for very wide rows) */
typedef struct { uint64_t *h; void *heap; uint64_t h0[1024]; } scratch_t;
static int scratch_init(scratch_t *s, int64_t n) {
    /* 8-bit draws for whole words, then a rank mask of as many words and one more */
    const int64_t need = ((n + 63) / 64) * 9 + 1;
    s->heap = 0; s->h = s->h0;
    if (need <= 1024) return 0;
    s->heap = malloc((size_t)need * sizeof(uint64_t));
    if (!s->heap) return -1;
    s->h = (uint64_t *)s->heap;
    return 0;
}
static void scratch_free(scratch_t *s) { free(s->heap); }

/* Row r's subset of exactly k of n (0 < k < n) into bits [ceil(n / 64)]. */
static void draw_row(uint64_t *bits, uint64_t *h, int64_t r, int64_t n, int64_t k, uint64_t key) {
    const uint64_t seed = row_seed(key, r);
    const int64_t words = (n + 63) / 64;
    if (n <= 64) {
        const int64_t d = k <= n - k ? k : n - k;
        uint64_t b = floyd_word((uint32_t *)h, seed, n, d);
        bits[0] = d == k ? b : ~b & low_bits(n);
        return;
    }
    /* keep each feature when its 8 random bits fall below the threshold */
    const uint64_t t = ((uint64_t)k << 8) / (uint64_t)n;
    const uint8_t thr = (uint8_t)(t > 0xff ? 0xff : t);
    int64_t c = 0;
#if defined(MCLN_AVX512) && defined(__AVX512DQ__)
    /* eight SplitMix64 outputs (draws 8 w + 1 .. 8 w + 8) per word, in one vector */
    const __m512i m1 = _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL);
    const __m512i m2 = _mm512_set1_epi64((long long)0x94D049BB133111EBULL);
    const __m512i step = _mm512_set1_epi64((long long)(8 * GAMMA));
    __m512i z0 = _mm512_add_epi64(
        _mm512_set1_epi64((long long)seed),
        _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1),
                           _mm512_set1_epi64((long long)GAMMA)));
    (void)h;
    for (int64_t w = 0; w < words; ++w, z0 = _mm512_add_epi64(z0, step)) {
        __m512i z = _mm512_mullo_epi64(_mm512_xor_si512(z0, _mm512_srli_epi64(z0, 30)), m1);
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
        z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
        uint64_t v = _mm512_cmplt_epu8_mask(z, _mm512_set1_epi8((char)thr));
#else
    /* the same draws; byte e of draw i (bits 8 e .. 8 e + 7) decides feature 8 i + e */
    _Pragma("omp simd")
    for (int64_t i = 0; i < words * 8; ++i) h[i] = mix64(seed + (uint64_t)(i + 1) * GAMMA);
    for (int64_t w = 0; w < words; ++w) {
        uint64_t v = 0;
        for (int64_t j = 0; j < 8; ++j) v |= bytes_below(h[w * 8 + j], thr) << (8 * j);
#endif
        v &= low_bits(n - w * 64);
        bits[w] = v;
        c += __builtin_popcountll(v);
    }
    if (c == k) return;
    /* then exactly k: a uniform set of |c - k| ranks among the c kept (to remove) or the n - c
       others (to add), from a second stream, and the features of those ranks flipped */
    const uint64_t seed2 = mix64(seed ^ 0xD1B54A32D192ED03ULL);
    const int want = c > k;
    const int64_t m = want ? c : n - c, e = want ? c - k : k - c;
    const uint64_t flip = want ? 0 : ~0ULL; /* the kept, or the others */
    uint64_t *ranks = h + words * 8;
    floyd_ranks(ranks, words + 1, seed2, m, e);
    int64_t p = 0;
    for (int64_t w = 0; w < words; ++w) {
        const uint64_t v = (bits[w] ^ flip) & low_bits(n - w * 64);
        const int64_t pc = __builtin_popcountll(v);
        bits[w] ^= pdep64(extract_bits(ranks, p, pc), v);
        p += pc;
    }
}

/* the subsets of rows r0..r1 as a 0/1 mask [R, n] */
static int mcln_sample_range(uint8_t *m, int64_t r0, int64_t r1, int64_t n, int64_t k,
                             uint64_t key) {
    scratch_t s;
    if (scratch_init(&s, n)) return -1;
    const int64_t words = (n + 63) / 64;
    uint64_t *bits = (uint64_t *)malloc((size_t)words * sizeof(uint64_t));
    if (!bits) { scratch_free(&s); return -1; }
    for (int64_t r = r0; r < r1; ++r) {
        uint8_t *mr = m + r * n;
        if (k <= 0 || k >= n) { memset(mr, k > 0, (size_t)n); continue; }
        draw_row(bits, s.h, r, n, k, key);
        for (int64_t i = 0; i < n; ++i) mr[i] = (uint8_t)((bits[i >> 6] >> (i & 63)) & 1);
    }
    free(bits);
    scratch_free(&s);
    return 0;
}
/* The row functions are inlined into callers that pass common widths as constants, so the
   compiler emits loops of known length for them (per-field embedding norms have D = 8..64:
   a generic loop with its vector remainder handling costs more than the work there). */
/* Storage and arithmetic: f32 and f64 rows are stored as they compute; bf16 rows (the bits of
   a bfloat16) are widened to float on load and rounded to nearest even on store, so a bf16
   row's statistics, output and gradients are the float32 kernel's on the widened row, rounded
   once. The affine parameters, their gradients and the row statistics are float32.
   A row's mask `m` is NULL for the full set (k = n: LayerNorm). */
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
#define BIT(m, i) (((m)[(i) >> 6] >> ((i) & 63)) & 1)
/* the row's statistics from its shifted sums: mean and 1/std over the k of the subset */
INLINE void finish_stats(double c0, double s, double q, int64_t k, double eps, double *mu,
                         double *rs) {
    double ms = s / (double)k;
    double var = q / (double)k - ms * ms;
    if (var < 0) var = 0;
    *mu = c0 + ms;
    *rs = 1.0 / sqrt(var + eps);
}
/* Plain C rows (float64 everywhere; float32 and bf16 without AVX-512). */
#define DEFINE_PLAIN(S, T, SUF)                                                                \
INLINE void fwd_row_##SUF(const S *xr, const T *w, const T *b, S *yr, const uint64_t *m,      \
                          T *mean, T *rstd, const int64_t n, int64_t k, double eps) {         \
    /* both moments in one pass, shifted by the row's first element so that a large common */ \
    /* offset does not cancel: v = sum_S (x-c)^2 / k - (sum_S (x-c) / k)^2 */                 \
    const T c0 = LD_##SUF(xr[0]);                                                             \
    T s = 0, q = 0;                                                                           \
    if (m) { _Pragma("omp simd reduction(+:s,q)") for (int64_t i = 0; i < n; ++i) {          \
        T z = BIT(m, i) ? LD_##SUF(xr[i]) - c0 : (T)0; s += z; q += z * z; } }                \
    else { _Pragma("omp simd reduction(+:s,q)") for (int64_t i = 0; i < n; ++i) {            \
        T z = LD_##SUF(xr[i]) - c0; s += z; q += z * z; } }                                   \
    double mud, rsd;                                                                          \
    finish_stats((double)c0, s, q, k, eps, &mud, &rsd);                                       \
    const T mu = (T)mud, rs = (T)rsd;                                                         \
    *mean = mu; *rstd = rs;                                                                   \
    if (w && b) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                        \
        yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs * w[i] + b[i]); }                        \
    else if (w) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                        \
        yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs * w[i]); }                               \
    else if (b) { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                        \
        yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs + b[i]); }                               \
    else { _Pragma("omp simd") for (int64_t i = 0; i < n; ++i)                               \
        yr[i] = ST_##SUF((LD_##SUF(xr[i]) - mu) * rs); }                                      \
}                                                                                             \
/* dx = rs (g - [i in S] (a + c xhat)), a = sum(g) / k, c = sum(g xhat) / k over the row */   \
INLINE void bwd_row_##SUF(const S *dyr, const S *xr, const T *w, const uint64_t *m, S *dxr,   \
                          T *dw, T *db, const int64_t n, T mu, T rs, int64_t k) {             \
    T A = 0, B = 0;                                                                           \
    if (w) {                                                                                  \
        _Pragma("omp simd reduction(+:A,B)")                                                  \
        for (int64_t i = 0; i < n; ++i) {                                                     \
            T xh = (LD_##SUF(xr[i]) - mu) * rs, dyi = LD_##SUF(dyr[i]), gy = dyi * w[i];      \
            A += gy; B += gy * xh; dw[i] += dyi * xh; db[i] += dyi;                           \
        }                                                                                     \
    } else {                                                                                  \
        _Pragma("omp simd reduction(+:A,B)")                                                  \
        for (int64_t i = 0; i < n; ++i) {                                                     \
            T xh = (LD_##SUF(xr[i]) - mu) * rs, dyi = LD_##SUF(dyr[i]);                       \
            A += dyi; B += dyi * xh; db[i] += dyi;                                            \
        }                                                                                     \
    }                                                                                         \
    const T a = A / (T)k, c = B / (T)k;                                                       \
    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {                                     \
        T xh = (LD_##SUF(xr[i]) - mu) * rs, gy = LD_##SUF(dyr[i]) * (w ? w[i] : (T)1);        \
        T in = m ? (T)BIT(m, i) : (T)1;                                                       \
        dxr[i] = ST_##SUF(rs * (gy - in * (a + c * xh)));                                     \
    }                                                                                         \
}
DEFINE_PLAIN(double, double, f64)
#ifndef MCLN_AVX512
DEFINE_PLAIN(float, float, f32)
DEFINE_PLAIN(uint16_t, float, bf16)
#else
/* AVX-512 rows of float32 or bf16: 16 floats a step, the subset's 16 bits as the mask. */
static inline __m512 vld_f32(const float *p, __mmask16 l) { return _mm512_maskz_loadu_ps(l, p); }
static inline void vst_f32(float *p, __m512 v, __mmask16 l) { _mm512_mask_storeu_ps(p, l, v); }
static inline __m512 vld_bf16(const uint16_t *p, __mmask16 l) {
    __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(l, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
static inline void vst_bf16(uint16_t *p, __m512 v, __mmask16 l) { /* as ST_bf16 */
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_srli_epi32(r, 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16),
                                                       _mm512_set1_epi32(0x40)));
    _mm256_mask_storeu_epi16(p, l, _mm512_cvtepi32_epi16(r));
}
INLINE __mmask16 tail16(int64_t n, int64_t i) {
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
}
/* the subset's bits of features i..i+15 (i a multiple of 16; bits past n are clear) */
INLINE __mmask16 sub16(const uint64_t *m, int64_t i, __mmask16 l) {
    return m ? (__mmask16)(m[i >> 6] >> (i & 63)) : l;
}
#define DEFINE_AVX(S, SUF)                                                                     \
INLINE void fwd_row_##SUF(const S *xr, const float *w, const float *b, S *yr,                 \
                          const uint64_t *m, float *mean, float *rstd, const int64_t n,       \
                          int64_t k, double eps) {                                            \
    const float c0f = LD_##SUF(xr[0]);                                                        \
    const __m512 c0 = _mm512_set1_ps(c0f);                                                    \
    __m512 s0 = _mm512_setzero_ps(), q0 = s0, s1 = s0, q1 = s0;                               \
    int64_t i = 0;                                                                            \
    for (; i + 32 <= n; i += 32) {                                                            \
        const __mmask16 m0 = sub16(m, i, 0xffff), m1 = sub16(m, i + 16, 0xffff);              \
        const __m512 z0 = _mm512_sub_ps(vld_##SUF(xr + i, 0xffff), c0);                       \
        const __m512 z1 = _mm512_sub_ps(vld_##SUF(xr + i + 16, 0xffff), c0);                  \
        s0 = _mm512_mask_add_ps(s0, m0, s0, z0); q0 = _mm512_mask3_fmadd_ps(z0, z0, q0, m0);  \
        s1 = _mm512_mask_add_ps(s1, m1, s1, z1); q1 = _mm512_mask3_fmadd_ps(z1, z1, q1, m1);  \
    }                                                                                         \
    for (; i < n; i += 16) {                                                                  \
        const __mmask16 l = tail16(n, i), m0 = sub16(m, i, l);                                \
        const __m512 z0 = _mm512_sub_ps(vld_##SUF(xr + i, l), c0);                            \
        s0 = _mm512_mask_add_ps(s0, m0, s0, z0); q0 = _mm512_mask3_fmadd_ps(z0, z0, q0, m0);  \
    }                                                                                         \
    double mud, rsd;                                                                          \
    finish_stats((double)c0f, _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)),                   \
                 _mm512_reduce_add_ps(_mm512_add_ps(q0, q1)), k, eps, &mud, &rsd);            \
    const float muf = (float)mud, rsf = (float)rsd;                                           \
    *mean = muf; *rstd = rsf;                                                                 \
    const __m512 mu = _mm512_set1_ps(muf), rs = _mm512_set1_ps(rsf);                          \
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();                      \
    for (i = 0; i < n; i += 16) {                                                             \
        const __mmask16 l = tail16(n, i);                                                     \
        const __m512 o = _mm512_mul_ps(_mm512_sub_ps(vld_##SUF(xr + i, l), mu), rs);          \
        const __m512 wv = w ? _mm512_maskz_loadu_ps(l, w + i) : one;                          \
        const __m512 bv = b ? _mm512_maskz_loadu_ps(l, b + i) : zero;                         \
        vst_##SUF(yr + i, _mm512_fmadd_ps(o, wv, bv), l);                                     \
    }                                                                                         \
}                                                                                             \
/* dx of a row from its sums A = sum(g), B = sum(g xhat) */                                    \
INLINE void bwd_dx_##SUF(const S *dyr, const S *xr, const float *w, const uint64_t *m,        \
                         S *dxr, const int64_t n, float muf, float rsf, int64_t k, float A,   \
                         float B) {                                                           \
    const __m512 mu = _mm512_set1_ps(muf), rs = _mm512_set1_ps(rsf);                          \
    const float kf = (float)k;                                                                \
    const __m512 a = _mm512_set1_ps(A / kf), c = _mm512_set1_ps(B / kf);                      \
    for (int64_t i = 0; i < n; i += 16) {                                                     \
        const __mmask16 l = tail16(n, i);                                                     \
        const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(vld_##SUF(xr + i, l), mu), rs);         \
        __m512 gy = vld_##SUF(dyr + i, l);                                                    \
        if (w) gy = _mm512_mul_ps(gy, _mm512_maskz_loadu_ps(l, w + i));                       \
        const __m512 t = _mm512_fmadd_ps(c, xh, a);                                           \
        gy = _mm512_mask_sub_ps(gy, sub16(m, i, l), gy, t);                                   \
        vst_##SUF(dxr + i, _mm512_mul_ps(rs, gy), l);                                         \
    }                                                                                         \
}                                                                                             \
INLINE void bwd_row_##SUF(const S *dyr, const S *xr, const float *w, const uint64_t *m,       \
                          S *dxr, float *dw, float *db, const int64_t n, float muf,           \
                          float rsf, int64_t k) {                                             \
    const __m512 mu = _mm512_set1_ps(muf), rs = _mm512_set1_ps(rsf);                          \
    __m512 A = _mm512_setzero_ps(), B = A;                                                    \
    for (int64_t i = 0; i < n; i += 16) {                                                     \
        const __mmask16 l = tail16(n, i);                                                     \
        const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(vld_##SUF(xr + i, l), mu), rs);         \
        const __m512 dy = vld_##SUF(dyr + i, l);                                              \
        __m512 gy = dy;                                                                       \
        if (w) {                                                                              \
            gy = _mm512_mul_ps(dy, _mm512_maskz_loadu_ps(l, w + i));                          \
            _mm512_mask_storeu_ps(dw + i, l,                                                  \
                                  _mm512_fmadd_ps(dy, xh, _mm512_maskz_loadu_ps(l, dw + i))); \
        }                                                                                     \
        _mm512_mask_storeu_ps(db + i, l, _mm512_add_ps(dy, _mm512_maskz_loadu_ps(l, db + i)));\
        A = _mm512_add_ps(A, gy); B = _mm512_fmadd_ps(gy, xh, B);                             \
    }                                                                                         \
    bwd_dx_##SUF(dyr, xr, w, m, dxr, n, muf, rsf, k, _mm512_reduce_add_ps(A),                 \
                 _mm512_reduce_add_ps(B));                                                    \
}                                                                                             \
/* two consecutive rows of the same affine row: dweight and dbias read and written once for   \
   both (the same sums, in the same order, as two calls of bwd_row) */                       \
INLINE void bwd_pair_##SUF(const S *dyr, const S *xr, const float *w, const uint64_t *m0,     \
                           const uint64_t *m1, S *dxr, float *dw, float *db, const int64_t n, \
                           float mu0f, float rs0f, float mu1f, float rs1f, int64_t k) {       \
    const __m512 mu0 = _mm512_set1_ps(mu0f), rs0 = _mm512_set1_ps(rs0f);                      \
    const __m512 mu1 = _mm512_set1_ps(mu1f), rs1 = _mm512_set1_ps(rs1f);                      \
    __m512 A0 = _mm512_setzero_ps(), B0 = A0, A1 = A0, B1 = A0;                               \
    for (int64_t i = 0; i < n; i += 16) {                                                     \
        const __mmask16 l = tail16(n, i);                                                     \
        const __m512 xh0 = _mm512_mul_ps(_mm512_sub_ps(vld_##SUF(xr + i, l), mu0), rs0);      \
        const __m512 xh1 = _mm512_mul_ps(_mm512_sub_ps(vld_##SUF(xr + n + i, l), mu1), rs1);  \
        const __m512 dy0 = vld_##SUF(dyr + i, l), dy1 = vld_##SUF(dyr + n + i, l);            \
        __m512 gy0 = dy0, gy1 = dy1;                                                          \
        if (w) {                                                                              \
            const __m512 wv = _mm512_maskz_loadu_ps(l, w + i);                                \
            gy0 = _mm512_mul_ps(dy0, wv); gy1 = _mm512_mul_ps(dy1, wv);                       \
            __m512 d = _mm512_fmadd_ps(dy0, xh0, _mm512_maskz_loadu_ps(l, dw + i));           \
            _mm512_mask_storeu_ps(dw + i, l, _mm512_fmadd_ps(dy1, xh1, d));                   \
        }                                                                                     \
        __m512 e = _mm512_add_ps(dy0, _mm512_maskz_loadu_ps(l, db + i));                      \
        _mm512_mask_storeu_ps(db + i, l, _mm512_add_ps(dy1, e));                              \
        A0 = _mm512_add_ps(A0, gy0); B0 = _mm512_fmadd_ps(gy0, xh0, B0);                      \
        A1 = _mm512_add_ps(A1, gy1); B1 = _mm512_fmadd_ps(gy1, xh1, B1);                      \
    }                                                                                         \
    bwd_dx_##SUF(dyr, xr, w, m0, dxr, n, mu0f, rs0f, k, _mm512_reduce_add_ps(A0),             \
                 _mm512_reduce_add_ps(B0));                                                   \
    bwd_dx_##SUF(dyr + n, xr + n, w, m1, dxr + n, n, mu1f, rs1f, k,                           \
                 _mm512_reduce_add_ps(A1), _mm512_reduce_add_ps(B1));                         \
}
DEFINE_AVX(float, f32)
DEFINE_AVX(uint16_t, bf16)
#endif
/* the backward of rows by pairs where there is a pair function (PAIRED_x 0: none) */
#ifdef MCLN_AVX512
#define PAIRED_f32 1
#define PAIRED_bf16 1
#define PAIR_f32 bwd_pair_f32
#define PAIR_bf16 bwd_pair_bf16
#else
#define PAIRED_f32 0
#define PAIRED_bf16 0
#define PAIR_f32(...)
#define PAIR_bf16(...)
#endif
#define PAIRED_f64 0
#define PAIR_f64(...)

#define DEFINE(S, T, SUF)                                                                     \
INLINE void fwd_rows_##SUF(const S *x, const T *w0, const T *b0, S *y, uint64_t *m0,         \
                    T *mean, T *rstd, int64_t r0, int64_t r1, const int64_t n, int64_t g,     \
                    int64_t k, double eps, uint64_t key, uint64_t *h) {                       \
    /* row r = sample * g + group: the group's affine pair (group counted, not divided) */  \
    const int64_t words = (n + 63) / 64;                                                      \
    int64_t gi = r0 % g;                                                                      \
    for (int64_t r = r0; r < r1; ++r, gi = (gi + 1 == g) ? 0 : gi + 1) {                     \
        uint64_t *m = m0 ? m0 + r * words : 0;                                                \
        if (m) draw_row(m, h, r, n, k, key);                                                  \
        fwd_row_##SUF(x + r * n, w0 ? w0 + gi * n : 0, b0 ? b0 + gi * n : 0, y + r * n, m,   \
                      mean + r, rstd + r, n, k, eps);                                         \
    }                                                                                         \
}                                                                                             \
INLINE void bwd_rows_##SUF(const S *dy, const S *x, const T *w0, const uint64_t *m0,         \
                    const T *mean, const T *rstd, S *dx, T *dw0, T *db0, int64_t r0,          \
                    int64_t r1, const int64_t n, int64_t g, int64_t k) {                      \
    const int64_t words = (n + 63) / 64;                                                      \
    if (PAIRED_##SUF && g == 1) { /* one affine row: rows by pairs */                         \
        int64_t r = r0;                                                                       \
        for (; r + 2 <= r1; r += 2)                                                           \
            PAIR_##SUF(dy + r * n, x + r * n, w0, m0 ? m0 + r * words : 0,                    \
                       m0 ? m0 + (r + 1) * words : 0, dx + r * n, dw0, db0, n, mean[r],       \
                       rstd[r], mean[r + 1], rstd[r + 1], k);                                 \
        r0 = r;                                                                               \
    }                                                                                         \
    int64_t gi = r0 % g;                                                                      \
    for (int64_t r = r0; r < r1; ++r, gi = (gi + 1 == g) ? 0 : gi + 1) {                     \
        const int64_t off = gi * n;                                                           \
        bwd_row_##SUF(dy + r * n, x + r * n, w0 ? w0 + off : 0, m0 ? m0 + r * words : 0,     \
                      dx + r * n, dw0 ? dw0 + off : 0, db0 + off, n, mean[r], rstd[r], k);    \
    }                                                                                         \
}                                                                                             \
static int mcln_fwd_range_##SUF(const S *x, const T *w, const T *b, S *y, uint64_t *m,      \
                   T *mean, T *rstd, int64_t r0, int64_t r1, int64_t n, int64_t g, int64_t k, \
                   double eps, uint64_t key) {                                                \
    scratch_t sc;                                                                             \
    if (scratch_init(&sc, n)) return -1;                                                      \
    switch (n) {                                                                              \
    case 8: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, 8, g, k, eps, key, sc.h); break; \
    case 16: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, 16, g, k, eps, key, sc.h); break; \
    case 32: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, 32, g, k, eps, key, sc.h); break; \
    default: fwd_rows_##SUF(x, w, b, y, m, mean, rstd, r0, r1, n, g, k, eps, key, sc.h);      \
    }                                                                                         \
    scratch_free(&sc);                                                                        \
    return 0;                                                                                 \
}                                                                                             \
static void mcln_bwd_range_##SUF(const S *dy, const S *x, const T *w, const uint64_t *m,    \
                    const T *mean, const T *rstd, S *dx, T *dw, T *db, int64_t r0, int64_t r1,\
                    int64_t n, int64_t g, int64_t k) {                                        \
    switch (n) {                                                                              \
    case 8: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, 8, g, k); break;      \
    case 16: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, 16, g, k); break;    \
    case 32: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, 32, g, k); break;    \
    default: bwd_rows_##SUF(dy, x, w, m, mean, rstd, dx, dw, db, r0, r1, n, g, k);            \
    }                                                                                         \
}
DEFINE(float, float, f32)
DEFINE(double, double, f64)
DEFINE(uint16_t, float, bf16)

/* ---- The exported kernels: the functions above over chunks of rows ---- */

/* The subsets of the rows as a 0/1 mask [R, n] (see mcln_sample_range). */
int mcln_sample(uint8_t *m, int64_t n, int64_t k, uint64_t key, CHUNKS) {
    int failed = 0;
    FOR_EACH_CHUNK_WITH(reduction(| : failed),
                        failed |= mcln_sample_range(m, lo, hi, n, k, key));
    return failed;
}

/* m: the subsets' bits [R, ceil(n / 64)] written by the forward and read by the backward, or
   NULL for the full set (k = n); dw (NULL: no weight), db: [chunks, g, n] partial sums. */
#define DEFINE_CHUNKED(S, T, SUF)                                                             \
int mcln_fwd_##SUF(const S *x, const T *w, const T *b, S *y, uint64_t *m, T *mean, T *rstd,  \
                   int64_t n, int64_t g, int64_t k, double eps, uint64_t key, CHUNKS) {       \
    int failed = 0;                                                                           \
    FOR_EACH_CHUNK_WITH(reduction(| : failed),                                                \
                        failed |= mcln_fwd_range_##SUF(x, w, b, y, m, mean, rstd, lo, hi, n,  \
                                                       g, k, eps, key));                      \
    return failed;                                                                            \
}                                                                                             \
void mcln_bwd_##SUF(const S *dy, const S *x, const T *w, const uint64_t *m, const T *mean,   \
                    const T *rstd, S *dx, T *dw, T *db, int64_t n, int64_t g, int64_t k,      \
                    CHUNKS) {                                                                 \
    FOR_EACH_CHUNK(mcln_bwd_range_##SUF(dy, x, w, m, mean, rstd, dx, dw ? dw + c * g * n : 0, \
                                        db + c * g * n, lo, hi, n, g, k));                    \
}
DEFINE_CHUNKED(float, float, f32)
DEFINE_CHUNKED(double, double, f64)
DEFINE_CHUNKED(uint16_t, float, bf16)
