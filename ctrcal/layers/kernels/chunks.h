/* The calling convention of ctrcal's chunked CPU kernels, included by cpu_kernels.c and
 * mcln_kernel.c (ctrcal/layers/kernels/chunks.py is its Python side).
 *
 * A kernel takes its work as chunks: `bounds` [chunks + 1] holds the row (or element) ranges
 * [bounds[c], bounds[c + 1]), and a call runs chunks [c0, c1) of them -- in parallel when the
 * library is built with OpenMP, which it is only where PyTorch's own GNU OpenMP runtime is
 * already loaded: the kernels then run on torch's team of threads, with no second pool
 * competing with torch's spinning workers for the cores. Partial sums (gradients of vectors)
 * go to one slice per chunk, added up by the caller, so the results do not depend on which
 * thread ran which chunk. */
#ifndef CTRCAL_CHUNKS_H
#define CTRCAL_CHUNKS_H
#include <stdint.h>

#define CHUNKS const int64_t *restrict bounds, int64_t c0, int64_t c1
#define CHUNKS_PRAGMA_(text) _Pragma(#text)

/* Runs CALL for every chunk c in [c0, c1), with lo, hi its range; CLAUSES are more clauses
 * of the parallel loop (a reduction), or nothing. */
#define FOR_EACH_CHUNK_WITH(CLAUSES, CALL)                                                     \
    CHUNKS_PRAGMA_(omp parallel for if (c1 - c0 > 1) num_threads((int)(c1 - c0))              \
                   schedule(static, 1) CLAUSES)                                               \
    for (int64_t c = c0; c < c1; ++c) {                                                        \
        const int64_t lo = bounds[c], hi = bounds[c + 1];                                      \
        CALL;                                                                                  \
    }
#define FOR_EACH_CHUNK(CALL) FOR_EACH_CHUNK_WITH(, CALL)

/* 1 when the chunks of a call run in parallel (an OpenMP build), else 0. */
int chunks_in_parallel(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

#endif
