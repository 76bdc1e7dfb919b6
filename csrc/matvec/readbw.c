/* readbw.c -- the memory read-bandwidth probe of benchmarks/bench_matvec.py: a 64-bit
 * integer sum over a buffer (16-byte loads on x86-64, 4 independent accumulators, the
 * same software prefetch as the matvec kernels so that it stays their upper bound),
 * split statically over `threads` OpenMP threads. Not part of any kernel table. */
#include "../cortiq.h"
#include "qmat.h" /* CQ_PF_DIST, CQ_PF_NEAR */
#include <string.h>
#ifdef CORTIQ_HAVE_OPENMP
#include <omp.h>
#endif
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#include <xmmintrin.h>
#define CQ_RB_SSE2 1
#endif

#define BLK 4096 /* bytes per work item */

static uint64_t sum_block(const uint8_t *p) {
#ifdef CQ_RB_SSE2
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < BLK; i += 64) {
        _mm_prefetch((const char *)(p + i + CQ_PF_DIST), _MM_HINT_T1);
        _mm_prefetch((const char *)(p + i + CQ_PF_NEAR), _MM_HINT_T0);
        s0 = _mm_add_epi64(s0, _mm_loadu_si128((const __m128i *)(p + i)));
        s1 = _mm_add_epi64(s1, _mm_loadu_si128((const __m128i *)(p + i + 16)));
        s2 = _mm_add_epi64(s2, _mm_loadu_si128((const __m128i *)(p + i + 32)));
        s3 = _mm_add_epi64(s3, _mm_loadu_si128((const __m128i *)(p + i + 48)));
    }
    __m128i s = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
    uint64_t w[2];
    _mm_storeu_si128((__m128i *)w, s);
    return w[0] + w[1];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, w[4];
    for (size_t i = 0; i < BLK; i += 32) {
        memcpy(w, p + i, 32);
        s0 += w[0]; s1 += w[1]; s2 += w[2]; s3 += w[3];
    }
    return s0 + s1 + s2 + s3;
#endif
}

uint64_t cq_read_sum(const uint8_t *p, size_t n, int threads) {
    uint64_t total = 0;
    long nblk = (long)(n / BLK);
    (void)threads;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) reduction(+ : total)
#endif
    for (long b = 0; b < nblk; b++) total += sum_block(p + (size_t)b * BLK);
    for (size_t i = (size_t)nblk * BLK; i < n; i++) total += p[i];
    return total;
}
