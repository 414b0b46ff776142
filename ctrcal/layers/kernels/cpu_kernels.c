/* CPU kernels of training: fused ReLU + inverted dropout, embedding table lookups
 * (loaded by ctrcal/layers/kernels/cpu_kernels.py).
 *
 * Dropout: element i (flat index) is kept when the high 32 bits of mix64(key + (i + 1) * GOLDEN) are
 * below `threshold` (= round((1 - p) * 2^32)): SplitMix64's output function on its own
 * counter sequence, so every element's draw is a pure function of (key, i) -- any split of the
 * elements between threads gives the same mask, and the loops vectorise (no state carried
 * from one element to the next). ctrcal/layers/dropout.py holds the same function in torch
 * (the fallback, and the reference the tests compare with).
 *
 * Every pointer argument is `restrict`: the Python callers never pass overlapping buffers, and
 * without that promise GCC leaves a loop that stores into one array while it accumulates into
 * another unvectorised (the masked-input backward ran one element at a time).
 *
 * Threads: every exported kernel runs one of the functions below over chunks of its rows (or
 * elements), by the convention of chunks.h.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "chunks.h"

#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline int kept(uint64_t key, int64_t i, uint64_t threshold) {
    return (mix64(key + (uint64_t)(i + 1) * GOLDEN) >> 32) < threshold;
}

/* A row's LayerNorm statistics: mean and 1 / sqrt(biased variance + eps). */
static inline void row_stats(const float *restrict xr, int64_t n, float eps, float *mu_out,
                             float *rs_out) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += xr[j];
    float mu = s / (float)n;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < n; ++j) {
        float d = xr[j] - mu;
        v += d * d;
    }
    *mu_out = mu;
    *rs_out = 1.0f / sqrtf(v / (float)n + eps);
}

/* ReLU then inverted dropout of one normalised, affine value h (element i of the call). */
static inline float relu_dropout1(float h, uint64_t key, int64_t i, uint64_t threshold,
                                  float scale) {
    return (kept(key, i, threshold) && !(h <= 0.0f)) ? h * scale : 0.0f;
}

/* The LayerNorm backward's last pass over a row: dxr holds dh (the affine output's
 * gradient) and becomes dx, given the row means m1 = mean(dh * w), m2 = mean(dh * w * xhat). */
static inline void ln_dx_finish(float *restrict dxr, const float *restrict xr,
                                const float *restrict w, float mu, float rs, float m1, float m2,
                                int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        float xh = (xr[j] - mu) * rs;
        dxr[j] = rs * (dxr[j] * w[j] - m1 - xh * m2);
    }
}

/* y[i] = x[i] * scale where element i is kept and x[i] > 0 (NaN passes, as in ReLU), else 0,
 * for i in [i0, i1). */
static void relu_dropout_fwd_f32_range(const float *restrict x, float *restrict y, int64_t i0, int64_t i1,
                          uint64_t key, uint64_t threshold, float scale) {
    for (int64_t i = i0; i < i1; ++i) {
        float v = x[i];
        y[i] = (kept(key, i, threshold) && !(v <= 0.0f)) ? v * scale : 0.0f;
    }
}

static void relu_dropout_fwd_f64_range(const double *restrict x, double *restrict y, int64_t i0, int64_t i1,
                          uint64_t key, uint64_t threshold, double scale) {
    for (int64_t i = i0; i < i1; ++i) {
        double v = x[i];
        y[i] = (kept(key, i, threshold) && !(v <= 0.0)) ? v * scale : 0.0;
    }
}

/* dx[i] = g[i] * scale where the output y[i] is not <= 0 (kept and positive), else 0. */
static void relu_dropout_bwd_f32_range(const float *restrict g, const float *restrict y, float *restrict dx,
                          int64_t i0, int64_t i1, float scale) {
    for (int64_t i = i0; i < i1; ++i) dx[i] = !(y[i] <= 0.0f) ? g[i] * scale : 0.0f;
}

static void relu_dropout_bwd_f64_range(const double *restrict g, const double *restrict y, double *restrict dx,
                          int64_t i0, int64_t i1, double scale) {
    for (int64_t i = i0; i < i1; ++i) dx[i] = !(y[i] <= 0.0) ? g[i] * scale : 0.0;
}

/* keep[i] = 1 where element i is kept, for i in [i0, i1). */
static void dropout_keep_mask_range(uint8_t *restrict keep, int64_t i0, int64_t i1, uint64_t key,
                       uint64_t threshold) {
    for (int64_t i = i0; i < i1; ++i) keep[i] = (uint8_t)kept(key, i, threshold);
}

/* ---- Embedding table lookups (ctrcal/layers/table_lookup.py) ----
 * ids [B, T] (int64, row-major), offsets [T]: row of (b, t) is ids[b, t] + offsets[t].
 * out / grad: [B, *, D] with `row_stride` elements between batch rows; the T looked-up fields
 * start at field `field0` (so numeric fields can sit before them in the same tensor).
 * Table rows are random accesses into a table much larger than the caches: each loop asks for
 * the rows of the batch row AHEAD_ROWS further on (prefetch), so that many cache misses are in
 * flight at once instead of one at a time. */
#define AHEAD_ROWS 2

/* out[b, field0 + t, :] = table[row(b, t), :] for b in [b0, b1). Returns -1, or the flat
 * index b * T + t of the first row outside [0, rows) (nothing is read for it). */
static int64_t table_gather_f32_range(const float *restrict table, int64_t rows, const int64_t *restrict ids,
                         const int64_t *restrict offsets, float *restrict out, int64_t b0,
                         int64_t b1, int64_t T, int64_t D, int64_t row_stride, int64_t field0) {
    for (int64_t b = b0; b < b1; ++b) {
        float *dst = out + b * row_stride + field0 * D;
        int ahead = b + AHEAD_ROWS < b1;
        for (int64_t t = 0; t < T; ++t) {
            int64_t r = ids[b * T + t] + offsets[t];
            if (r < 0 || r >= rows) return b * T + t;
            if (ahead) {
                int64_t rp = ids[(b + AHEAD_ROWS) * T + t] + offsets[t];
                if (rp >= 0 && rp < rows) __builtin_prefetch(table + rp * D, 0, 0);
            }
            const float *src = table + r * D;
            for (int64_t j = 0; j < D; ++j) dst[t * D + j] = src[j];
        }
    }
    return -1;
}

/* grad_table[row(b, t), :] += grad[b, field0 + t, :] for every (b, t) whose row lies in
 * [r0, r1): threads given disjoint row ranges never write the same row, and each row
 * receives its contributions in batch order (deterministic). Rows were checked by the
 * gather of the same ids. */
static void table_scatter_add_f32_range(float *restrict grad_table, const int64_t *restrict ids,
                           const int64_t *restrict offsets, const float *restrict grad, int64_t B,
                           int64_t T, int64_t D, int64_t row_stride, int64_t field0, int64_t r0,
                           int64_t r1) {
    for (int64_t b = 0; b < B; ++b) {
        const float *src = grad + b * row_stride + field0 * D;
        int ahead = b + AHEAD_ROWS < B;
        for (int64_t t = 0; t < T; ++t) {
            if (ahead) {
                int64_t rp = ids[(b + AHEAD_ROWS) * T + t] + offsets[t];
                if (rp >= r0 && rp < r1) __builtin_prefetch(grad_table + rp * D, 1, 0);
            }
            int64_t r = ids[b * T + t] + offsets[t];
            if (r < r0 || r >= r1) continue;
            float *dst = grad_table + r * D;
            for (int64_t j = 0; j < D; ++j) dst[j] += src[t * D + j];
        }
    }
}

/* ---- LayerNorm -> ReLU -> inverted dropout, fused (ctrcal/layers/dropout.py) ----
 * Rows [r0, r1) of x [R, N]: h = (x - mean) * rstd * w + b (biased variance, eps inside the
 * square root, as torch.nn.LayerNorm), then y = h * scale where element r * N + j is kept
 * (the dropout draw above) and h > 0, else 0. mean / rstd [R] are saved for the backward. */
static void ln_relu_dropout_fwd_f32_range(const float *restrict x, const float *restrict w,
                             const float *restrict b, float *restrict y, float *restrict mean,
                             float *restrict rstd, int64_t r0, int64_t r1, int64_t n, float eps,
                             uint64_t key, uint64_t threshold, float scale) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float mu, rs;
        row_stats(xr, n, eps, &mu, &rs);
        mean[r] = mu;
        rstd[r] = rs;
        for (int64_t j = 0; j < n; ++j) {
            float h = (xr[j] - mu) * rs * w[j] + b[j];
            yr[j] = relu_dropout1(h, key, r * n + j, threshold, scale);
        }
    }
}

/* The backward of the above from the output gradient g and the output y (y > 0 exactly
 * where the element was kept and h > 0): dx for rows [r0, r1), and this chunk's partial
 * sums of the weight and bias gradients added into dw, db [N]. */
static void ln_relu_dropout_bwd_f32_range(const float *restrict g, const float *restrict y,
                             const float *restrict x, const float *restrict w,
                             const float *restrict mean, const float *restrict rstd,
                             float *restrict dx, float *restrict dw, float *restrict db,
                             int64_t r0, int64_t r1, int64_t n, float scale) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *gr = g + r * n, *yr = y + r * n, *xr = x + r * n;
        float *dxr = dx + r * n;
        float mu = mean[r], rs = rstd[r];
        float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t j = 0; j < n; ++j) {
            float dh = !(yr[j] <= 0.0f) ? gr[j] * scale : 0.0f;
            float xh = (xr[j] - mu) * rs;
            dw[j] += dh * xh;
            db[j] += dh;
            float a = dh * w[j];
            s1 += a;
            s2 += a * xh;
        }
        s1 /= (float)n;
        s2 /= (float)n;
        for (int64_t j = 0; j < n; ++j) {
            float dh = !(yr[j] <= 0.0f) ? gr[j] * scale : 0.0f;
            float xh = (xr[j] - mu) * rs;
            dxr[j] = rs * (dh * w[j] - s1 - xh * s2);
        }
    }
}

/* ---- The instance-guided mask applied to the block input (ctrcal/layers/mask_block.py) ----
 * t [R, N] = mask pre-activation without its bias, b [N] the bias, v [R, N] the block input:
 * z = (t + b) * v for rows [r0, r1). */
static void masked_input_fwd_f32_range(const float *restrict t, const float *restrict b,
                          const float *restrict v, float *restrict z, int64_t r0, int64_t r1,
                          int64_t n) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *tr = t + r * n, *vr = v + r * n;
        float *zr = z + r * n;
        for (int64_t j = 0; j < n; ++j) zr[j] = (tr[j] + b[j]) * vr[j];
    }
}

/* Its backward from g = dz: dt = g * v, dv = g * (t + b), and this chunk's column sums of dt
 * (the bias gradient) added into db [N]. */
static void masked_input_bwd_f32_range(const float *restrict g, const float *restrict t,
                          const float *restrict b, const float *restrict v, float *restrict dt,
                          float *restrict dv, float *restrict db, int64_t r0, int64_t r1,
                          int64_t n) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *gr = g + r * n, *tr = t + r * n, *vr = v + r * n;
        float *dtr = dt + r * n, *dvr = dv + r * n;
        for (int64_t j = 0; j < n; ++j) {
            float d = gr[j] * vr[j];
            dtr[j] = d;
            db[j] += d;
            dvr[j] = gr[j] * (tr[j] + b[j]);
        }
    }
}

/* ---- The masks' first layers, all blocks at once (ctrcal/layers/mask_block.py) ----
 * t [R, W] = v_emb times the blocks' stacked first-layer weights, without the bias; block k
 * owns the `widths[k]` columns after those of the blocks before it. h holds every block's
 * ReLU(t + b) as its own contiguous [R, widths[k]] matrix, one after the other: block k's
 * starts at element R * (widths[0] + ... + widths[k-1]). Rows [r0, r1). */
static void mask_hidden_fwd_f32_range(const float *restrict t, const float *restrict b, float *restrict h,
                         int64_t r0, int64_t r1, int64_t R, int64_t blocks,
                         const int64_t *restrict widths) {
    int64_t W = 0;
    for (int64_t k = 0; k < blocks; ++k) W += widths[k];
    for (int64_t r = r0; r < r1; ++r) {
        const float *tr = t + r * W;
        int64_t col = 0;
        for (int64_t k = 0; k < blocks; ++k) {
            int64_t w = widths[k];
            float *hr = h + R * col + r * w;
            const float *tk = tr + col, *bk = b + col;
            for (int64_t j = 0; j < w; ++j) {
                float z = tk[j] + bk[j];
                hr[j] = z <= 0.0f ? 0.0f : z; /* NaN passes, as in ReLU */
            }
            col += w;
        }
    }
}

/* Its backward: g[k] is block k's output gradient [R, widths[k]] (contiguous); dt [R, W] gets
 * g where h is not <= 0, else 0, and db [W] this chunk's column sums of dt. */
static void mask_hidden_bwd_f32_range(const float *const *restrict g, const float *restrict h,
                         float *restrict dt, float *restrict db, int64_t r0, int64_t r1,
                         int64_t R, int64_t blocks, const int64_t *restrict widths) {
    int64_t W = 0;
    for (int64_t k = 0; k < blocks; ++k) W += widths[k];
    for (int64_t r = r0; r < r1; ++r) {
        float *dtr = dt + r * W;
        int64_t col = 0;
        for (int64_t k = 0; k < blocks; ++k) {
            int64_t w = widths[k];
            const float *gr = g[k] + r * w, *hr = h + R * col + r * w;
            float *dk = dtr + col, *dbk = db + col;
            for (int64_t j = 0; j < w; ++j) {
                float d = !(hr[j] <= 0.0f) ? gr[j] : 0.0f; /* as ReLU's backward */
                dk[j] = d;
                dbk[j] += d;
            }
            col += w;
        }
    }
}

/* ---- LayerNorm -> ReLU -> dropout -> Linear(n -> 1), fused (ctrcal/layers/logit_head.py) ----
 * The network's last activation y (as ln_relu_dropout_fwd_f32 computes it, with the same
 * dropout draws) is never stored: each row's logit[r] = sum_j y[r, j] * hw[j] is formed
 * while y is computed. The backward recomputes y from x, mean, rstd and the key. */
static void ln_relu_dropout_logit_fwd_f32_range(const float *restrict x, const float *restrict w,
                                   const float *restrict b, const float *restrict hw,
                                   float *restrict logit, float *restrict mean,
                                   float *restrict rstd, int64_t r0, int64_t r1, int64_t n,
                                   float eps, uint64_t key, uint64_t threshold, float scale) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *xr = x + r * n;
        float mu, rs;
        row_stats(xr, n, eps, &mu, &rs);
        mean[r] = mu;
        rstd[r] = rs;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < n; ++j) {
            float h = (xr[j] - mu) * rs * w[j] + b[j];
            float y = relu_dropout1(h, key, r * n + j, threshold, scale);
            acc += y * hw[j];
        }
        logit[r] = acc;
    }
}

/* Its backward from the logits' gradient gl [R]: dx for rows [r0, r1), and this chunk's
 * partial sums of the LayerNorm's weight and bias gradients and of the head weight's
 * gradient added into dw, db, dhw [n]. dx holds a row's dh until its second pass. */
static void ln_relu_dropout_logit_bwd_f32_range(const float *restrict gl, const float *restrict x,
                                   const float *restrict w, const float *restrict b,
                                   const float *restrict hw, const float *restrict mean,
                                   const float *restrict rstd, float *restrict dx,
                                   float *restrict dw, float *restrict db, float *restrict dhw,
                                   int64_t r0, int64_t r1, int64_t n, uint64_t key,
                                   uint64_t threshold, float scale) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *xr = x + r * n;
        float *dxr = dx + r * n;
        float mu = mean[r], rs = rstd[r], g = gl[r];
        float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t j = 0; j < n; ++j) {
            float xh = (xr[j] - mu) * rs;
            float h = xh * w[j] + b[j];
            int keep = kept(key, r * n + j, threshold) && !(h <= 0.0f);
            dhw[j] += keep ? h * scale * g : 0.0f;
            float dh = keep ? g * hw[j] * scale : 0.0f;
            dxr[j] = dh;
            dw[j] += dh * xh;
            db[j] += dh;
            float a = dh * w[j];
            s1 += a;
            s2 += a * xh;
        }
        ln_dx_finish(dxr, xr, w, mu, rs, s1 / (float)n, s2 / (float)n, n);
    }
}

/* ---- One block's LayerNorm -> ReLU -> dropout fused with the next block's masked input ----
 * (ctrcal/layers/mask_block.py). In a serial MaskNet a block's output y feeds only the next
 * block's masked input z = (t + c) * y (t: that block's mask without its bias c), so y is
 * never stored: z is formed while y is computed (y as ln_relu_dropout_fwd_f32 computes it,
 * with the same dropout draws), and the backward recomputes y from x, mean, rstd and the key.
 * Rows [r0, r1) of x, t, z [R, n]. */
static void ln_relu_dropout_mask_fwd_f32_range(const float *restrict x, const float *restrict w,
                                  const float *restrict b, const float *restrict t,
                                  const float *restrict c, float *restrict z,
                                  float *restrict mean, float *restrict rstd, int64_t r0,
                                  int64_t r1, int64_t n, float eps, uint64_t key,
                                  uint64_t threshold, float scale) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *xr = x + r * n, *tr = t + r * n;
        float *zr = z + r * n;
        float mu, rs;
        row_stats(xr, n, eps, &mu, &rs);
        mean[r] = mu;
        rstd[r] = rs;
        for (int64_t j = 0; j < n; ++j) {
            float h = (xr[j] - mu) * rs * w[j] + b[j];
            float y = relu_dropout1(h, key, r * n + j, threshold, scale);
            zr[j] = (tr[j] + c[j]) * y;
        }
    }
}

/* Its backward from gz = dz: dt = gz * y (the next block's mask gradient) with this chunk's
 * column sums added into dc [n], and through dy = gz * (t + c) the LayerNorm's backward: dx,
 * and this chunk's partial sums of its weight and bias gradients added into dw, db [n].
 * dx holds a row's dh until its second pass. */
static void ln_relu_dropout_mask_bwd_f32_range(const float *restrict gz, const float *restrict x,
                                  const float *restrict w, const float *restrict b,
                                  const float *restrict t, const float *restrict c,
                                  const float *restrict mean, const float *restrict rstd,
                                  float *restrict dx, float *restrict dt, float *restrict dw,
                                  float *restrict db, float *restrict dc, int64_t r0, int64_t r1,
                                  int64_t n, uint64_t key, uint64_t threshold, float scale) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *xr = x + r * n, *tr = t + r * n, *gr = gz + r * n;
        float *dxr = dx + r * n, *dtr = dt + r * n;
        float mu = mean[r], rs = rstd[r];
        float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
        for (int64_t j = 0; j < n; ++j) {
            float xh = (xr[j] - mu) * rs;
            float h = xh * w[j] + b[j];
            int keep = kept(key, r * n + j, threshold) && !(h <= 0.0f);
            float d = keep ? gr[j] * h * scale : 0.0f; /* gz * y */
            dtr[j] = d;
            dc[j] += d;
            float dh = keep ? gr[j] * (tr[j] + c[j]) * scale : 0.0f;
            dxr[j] = dh;
            dw[j] += dh * xh;
            db[j] += dh;
            float a = dh * w[j];
            s1 += a;
            s2 += a * xh;
        }
        ln_dx_finish(dxr, xr, w, mu, rs, s1 / (float)n, s2 / (float)n, n);
    }
}

/* ---- DCNv2's full-rank cross layer (ctrcal/layers/cross.py) ----
 * t [R, n] = x W^T without the bias b [n]: u = t + b is written over t (the backward needs
 * it), and y = x0 * u + x, for rows [r0, r1). */
static void cross_fwd_f32_range(float *restrict t, const float *restrict b,
                                const float *restrict x0, const float *restrict x,
                                float *restrict y, int64_t r0, int64_t r1, int64_t n) {
    for (int64_t r = r0; r < r1; ++r) {
        float *tr = t + r * n, *yr = y + r * n;
        const float *x0r = x0 + r * n, *xr = x + r * n;
        for (int64_t j = 0; j < n; ++j) {
            float u = tr[j] + b[j];
            tr[j] = u;
            yr[j] = x0r[j] * u + xr[j];
        }
    }
}

/* Its backward from g = dy: du = g * x0, and g * u added into dx0 (written when `first`:
 * the network's last layer, the first one back), and this chunk's column sums of du (the
 * bias gradient) added into db [n]. */
static void cross_bwd_f32_range(const float *restrict g, const float *restrict x0,
                                const float *restrict u, float *restrict du,
                                float *restrict dx0, float *restrict db, int64_t r0,
                                int64_t r1, int64_t n, int first) {
    for (int64_t r = r0; r < r1; ++r) {
        const float *gr = g + r * n, *x0r = x0 + r * n, *ur = u + r * n;
        float *dur = du + r * n, *dx0r = dx0 + r * n;
        if (first) {
            for (int64_t j = 0; j < n; ++j) {
                float d = gr[j] * x0r[j];
                dur[j] = d;
                db[j] += d;
                dx0r[j] = gr[j] * ur[j];
            }
        } else {
            for (int64_t j = 0; j < n; ++j) {
                float d = gr[j] * x0r[j];
                dur[j] = d;
                db[j] += d;
                dx0r[j] += gr[j] * ur[j];
            }
        }
    }
}

/* ---- Numeric embeddings (ctrcal/layers/embedding.py) ----
 * x [B, F] values (NaN = missing), w / bias / miss [F, D]: out[b, f, :] = miss[f, :] where
 * x[b, f] is NaN, else x[b, f] * w[f, :] (+ bias[f, :] when bias is not NULL). out rows are
 * `row_stride` elements apart, its F fields contiguous. Rows [b0, b1). */
static void numeric_embed_fwd_f32_range(const float *restrict x, const float *restrict w,
                           const float *restrict bias, const float *restrict miss,
                           float *restrict out, int64_t b0, int64_t b1, int64_t F, int64_t D,
                           int64_t row_stride) {
    for (int64_t r = b0; r < b1; ++r) {
        float *o = out + r * row_stride;
        for (int64_t f = 0; f < F; ++f) {
            float v = x[r * F + f];
            float *of = o + f * D;
            const float *wf = w + f * D, *mf = miss + f * D;
            if (isnan(v)) {
                for (int64_t j = 0; j < D; ++j) of[j] = mf[j];
            } else if (bias) {
                const float *bf = bias + f * D;
                for (int64_t j = 0; j < D; ++j) of[j] = v * wf[j] + bf[j];
            } else {
                for (int64_t j = 0; j < D; ++j) of[j] = v * wf[j];
            }
        }
    }
}

/* Its backward from g (laid out as out): this chunk's partial gradients of w, bias (when not
 * NULL) and miss [F, D] added into dw, dbias, dmiss. */
static void numeric_embed_bwd_f32_range(const float *restrict x, const float *restrict g,
                           float *restrict dw, float *restrict dbias, float *restrict dmiss,
                           int64_t b0, int64_t b1, int64_t F, int64_t D, int64_t row_stride) {
    for (int64_t r = b0; r < b1; ++r) {
        const float *gr = g + r * row_stride;
        for (int64_t f = 0; f < F; ++f) {
            float v = x[r * F + f];
            const float *gf = gr + f * D;
            if (isnan(v)) {
                float *mf = dmiss + f * D;
                for (int64_t j = 0; j < D; ++j) mf[j] += gf[j];
                continue;
            }
            float *wf = dw + f * D;
            for (int64_t j = 0; j < D; ++j) wf[j] += v * gf[j];
            if (dbias) {
                float *bf = dbias + f * D;
                for (int64_t j = 0; j < D; ++j) bf[j] += gf[j];
            }
        }
    }
}

/* ---- The exported kernels: the functions above over chunks (see the top of the file) ---- */

void relu_dropout_fwd_f32(const float *x, float *y, uint64_t key, uint64_t threshold, float scale,
                          CHUNKS) {
    FOR_EACH_CHUNK(relu_dropout_fwd_f32_range(x, y, lo, hi, key, threshold, scale));
}

void relu_dropout_fwd_f64(const double *x, double *y, uint64_t key, uint64_t threshold,
                          double scale, CHUNKS) {
    FOR_EACH_CHUNK(relu_dropout_fwd_f64_range(x, y, lo, hi, key, threshold, scale));
}

void relu_dropout_bwd_f32(const float *g, const float *y, float *dx, float scale, CHUNKS) {
    FOR_EACH_CHUNK(relu_dropout_bwd_f32_range(g, y, dx, lo, hi, scale));
}

void relu_dropout_bwd_f64(const double *g, const double *y, double *dx, double scale, CHUNKS) {
    FOR_EACH_CHUNK(relu_dropout_bwd_f64_range(g, y, dx, lo, hi, scale));
}

void dropout_keep_mask(uint8_t *keep, uint64_t key, uint64_t threshold, CHUNKS) {
    FOR_EACH_CHUNK(dropout_keep_mask_range(keep, lo, hi, key, threshold));
}

/* bad[c]: chunk c's answer (-1, or the first flat index outside the table). */
void table_gather_f32(const float *table, int64_t rows, const int64_t *ids,
                      const int64_t *offsets, float *out, int64_t T, int64_t D,
                      int64_t row_stride, int64_t field0, int64_t *bad, CHUNKS) {
    FOR_EACH_CHUNK(bad[c] = table_gather_f32_range(table, rows, ids, offsets, out, lo, hi, T, D,
                                                   row_stride, field0));
}

/* The chunks are ranges of table rows (each thread owns the rows it writes). */
void table_scatter_add_f32(float *grad_table, const int64_t *ids, const int64_t *offsets,
                           const float *grad, int64_t B, int64_t T, int64_t D, int64_t row_stride,
                           int64_t field0, CHUNKS) {
    FOR_EACH_CHUNK(table_scatter_add_f32_range(grad_table, ids, offsets, grad, B, T, D,
                                               row_stride, field0, lo, hi));
}

void ln_relu_dropout_fwd_f32(const float *x, const float *w, const float *b, float *y,
                             float *mean, float *rstd, int64_t n, float eps, uint64_t key,
                             uint64_t threshold, float scale, CHUNKS) {
    FOR_EACH_CHUNK(ln_relu_dropout_fwd_f32_range(x, w, b, y, mean, rstd, lo, hi, n, eps, key,
                                                 threshold, scale));
}

/* dw, db: [chunks, n] partial sums. */
void ln_relu_dropout_bwd_f32(const float *g, const float *y, const float *x, const float *w,
                             const float *mean, const float *rstd, float *dx, float *dw,
                             float *db, int64_t n, float scale, CHUNKS) {
    FOR_EACH_CHUNK(ln_relu_dropout_bwd_f32_range(g, y, x, w, mean, rstd, dx, dw + c * n,
                                                 db + c * n, lo, hi, n, scale));
}

void masked_input_fwd_f32(const float *t, const float *b, const float *v, float *z, int64_t n,
                          CHUNKS) {
    FOR_EACH_CHUNK(masked_input_fwd_f32_range(t, b, v, z, lo, hi, n));
}

/* db: [chunks, n] partial sums. */
void masked_input_bwd_f32(const float *g, const float *t, const float *b, const float *v,
                          float *dt, float *dv, float *db, int64_t n, CHUNKS) {
    FOR_EACH_CHUNK(masked_input_bwd_f32_range(g, t, b, v, dt, dv, db + c * n, lo, hi, n));
}

void mask_hidden_fwd_f32(const float *t, const float *b, float *h, int64_t R, int64_t blocks,
                         const int64_t *widths, CHUNKS) {
    FOR_EACH_CHUNK(mask_hidden_fwd_f32_range(t, b, h, lo, hi, R, blocks, widths));
}

/* db: [chunks, W] partial sums, W the sum of the widths. */
void mask_hidden_bwd_f32(const float *const *g, const float *h, float *dt, float *db, int64_t R,
                         int64_t blocks, const int64_t *widths, CHUNKS) {
    int64_t W = 0;
    for (int64_t k = 0; k < blocks; ++k) W += widths[k];
    FOR_EACH_CHUNK(mask_hidden_bwd_f32_range(g, h, dt, db + c * W, lo, hi, R, blocks, widths));
}

void ln_relu_dropout_logit_fwd_f32(const float *x, const float *w, const float *b,
                                   const float *hw, float *logit, float *mean, float *rstd,
                                   int64_t n, float eps, uint64_t key, uint64_t threshold,
                                   float scale, CHUNKS) {
    FOR_EACH_CHUNK(ln_relu_dropout_logit_fwd_f32_range(x, w, b, hw, logit, mean, rstd, lo, hi, n,
                                                       eps, key, threshold, scale));
}

/* dw, db, dhw: [chunks, n] partial sums. */
void ln_relu_dropout_logit_bwd_f32(const float *gl, const float *x, const float *w,
                                   const float *b, const float *hw, const float *mean,
                                   const float *rstd, float *dx, float *dw, float *db,
                                   float *dhw, int64_t n, uint64_t key, uint64_t threshold,
                                   float scale, CHUNKS) {
    FOR_EACH_CHUNK(ln_relu_dropout_logit_bwd_f32_range(gl, x, w, b, hw, mean, rstd, dx,
                                                       dw + c * n, db + c * n, dhw + c * n, lo,
                                                       hi, n, key, threshold, scale));
}

void ln_relu_dropout_mask_fwd_f32(const float *x, const float *w, const float *b, const float *t,
                                  const float *cb, float *z, float *mean, float *rstd, int64_t n,
                                  float eps, uint64_t key, uint64_t threshold, float scale,
                                  CHUNKS) {
    FOR_EACH_CHUNK(ln_relu_dropout_mask_fwd_f32_range(x, w, b, t, cb, z, mean, rstd, lo, hi, n,
                                                      eps, key, threshold, scale));
}

/* dw, db, dc: [chunks, n] partial sums. */
void ln_relu_dropout_mask_bwd_f32(const float *gz, const float *x, const float *w,
                                  const float *b, const float *t, const float *cb,
                                  const float *mean, const float *rstd, float *dx, float *dt,
                                  float *dw, float *db, float *dc, int64_t n, uint64_t key,
                                  uint64_t threshold, float scale, CHUNKS) {
    FOR_EACH_CHUNK(ln_relu_dropout_mask_bwd_f32_range(gz, x, w, b, t, cb, mean, rstd, dx, dt,
                                                      dw + c * n, db + c * n, dc + c * n, lo,
                                                      hi, n, key, threshold, scale));
}

void numeric_embed_fwd_f32(const float *x, const float *w, const float *bias, const float *miss,
                           float *out, int64_t F, int64_t D, int64_t row_stride, CHUNKS) {
    FOR_EACH_CHUNK(numeric_embed_fwd_f32_range(x, w, bias, miss, out, lo, hi, F, D, row_stride));
}

/* dw, dbias (NULL: no bias), dmiss: [chunks, F, D] partial sums. */
void numeric_embed_bwd_f32(const float *x, const float *g, float *dw, float *dbias, float *dmiss,
                           int64_t F, int64_t D, int64_t row_stride, CHUNKS) {
    FOR_EACH_CHUNK(numeric_embed_bwd_f32_range(x, g, dw + c * F * D,
                                               dbias ? dbias + c * F * D : NULL,
                                               dmiss + c * F * D, lo, hi, F, D, row_stride));
}

void cross_fwd_f32(float *t, const float *b, const float *x0, const float *x, float *y, int64_t n,
                   CHUNKS) {
    FOR_EACH_CHUNK(cross_fwd_f32_range(t, b, x0, x, y, lo, hi, n));
}

/* db: [chunks, n] partial sums. */
void cross_bwd_f32(const float *g, const float *x0, const float *u, float *du, float *dx0,
                   float *db, int64_t n, int first, CHUNKS) {
    FOR_EACH_CHUNK(cross_bwd_f32_range(g, x0, u, du, dx0, db + c * n, lo, hi, n, first));
}
