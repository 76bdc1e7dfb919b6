/* readbw.c -- the memory read-bandwidth probe of benchmarks/bench_matvec.py: a 64-bit
 * integer sum over a buffer (16-byte loads on x86-64, 4 independent accumulators),
 * split statically into `threads` slots of the kernel pool, each slot's part read as `streams`
 * (1..8) streams side by side: panels of `streams` lanes of CQ_LANE_BYTES, as the
 * AVX2 matvec drivers read rows. One stream takes the kernels' software prefetch;
 * several go without it, which read faster.
 * One stream per core leaves memory parallelism unused on some machines (Zen 3:
 * docs/PERFORMANCE.md, "Memory streams"). Not in any kernel table. */
#include "../cortiq.h"
#include "qmat.h" /* CQ_PF_DIST, CQ_PF_NEAR, CQ_LANE_BYTES */
#include "../pool.h"
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#include <xmmintrin.h>
#define CQ_RB_SSE2 1
#endif

#define BLK 4096 /* bytes per work item */
#define MAXS 8    /* streams at most */

/* The next 64-byte line of each of S streams (q[k] + i), into the four accumulators:
 * S streams read side by side, as the matvec drivers read S rows (CQ_ROW_STREAMS). */
#ifdef CQ_RB_SSE2
#define RB_LINE(q, i, S)                                                               \
    for (int k = 0; k < (S); k++) {                                                    \
        const uint8_t *l_ = q[k] + (i);                                                \
        if ((S) == 1) { /* one stream: the kernels' prefetch pair; several: none, */   \
            _mm_prefetch((const char *)l_ + CQ_PF_DIST, _MM_HINT_T1); /* which read */ \
            _mm_prefetch((const char *)l_ + CQ_PF_NEAR, _MM_HINT_T0); /* faster */     \
        }                                                                              \
        s0 = _mm_add_epi64(s0, _mm_loadu_si128((const __m128i *)l_));                  \
        s1 = _mm_add_epi64(s1, _mm_loadu_si128((const __m128i *)(l_ + 16)));           \
        s2 = _mm_add_epi64(s2, _mm_loadu_si128((const __m128i *)(l_ + 32)));           \
        s3 = _mm_add_epi64(s3, _mm_loadu_si128((const __m128i *)(l_ + 48)));           \
    }
#endif

/* Sum of n bytes (a multiple of 64) in each of S streams q[0..S), side by side line
 * by line. */
static uint64_t sum_streams(const uint8_t *const *q, size_t n, int S) {
#ifdef CQ_RB_SSE2
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    switch (S) { /* constant S: the stream loop unrolls */
    case 1: for (size_t i = 0; i < n; i += 64) { RB_LINE(q, i, 1) } break;
    case 2: for (size_t i = 0; i < n; i += 64) { RB_LINE(q, i, 2) } break;
    case 4: for (size_t i = 0; i < n; i += 64) { RB_LINE(q, i, 4) } break;
    default: for (size_t i = 0; i < n; i += 64) { RB_LINE(q, i, S) } break;
    }
    __m128i s = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
    uint64_t w[2];
    _mm_storeu_si128((__m128i *)w, s);
    return w[0] + w[1];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, w[4];
    for (size_t i = 0; i < n; i += 32)
        for (int k = 0; k < S; k++) {
            memcpy(w, q[k] + i, 32);
            s0 += w[0]; s1 += w[1]; s2 += w[2]; s3 += w[3];
        }
    return s0 + s1 + s2 + s3;
#endif
}

/* One read_sum call: slot t of nt reads blocks [nblk * t / nt, nblk * (t + 1) / nt):
 * panels of S lanes of CQ_LANE_BYTES read side by side, then what does not fill a
 * panel as one stream. */
typedef struct {
    const uint8_t *p;
    size_t nblk, panel;
    int S;
    uint64_t sums[CQ_POOL_MAX_SLOTS];
} read_job;

static void read_slot(void *arg, size_t t, size_t nt) {
    read_job *j = (read_job *)arg;
    const size_t b0 = j->nblk * t / nt, b1 = j->nblk * (t + 1) / nt;
    const int S = j->S;
    size_t b = b0;
    uint64_t total = 0;
    const uint8_t *q[MAXS];
    for (; S > 1 && b + j->panel <= b1; b += j->panel) {
        for (int k = 0; k < S; k++) q[k] = j->p + b * BLK + (size_t)k * CQ_LANE_BYTES;
        total += sum_streams(q, CQ_LANE_BYTES, S);
    }
    q[0] = j->p + b * BLK;
    j->sums[t] = total + sum_streams(q, (b1 - b) * BLK, 1);
}

uint64_t cq_read_sum(const uint8_t *p, size_t n, int threads, int streams) {
    const int S = streams < 1 ? 1 : streams > MAXS ? MAXS : streams;
    size_t parts = threads > 0 ? (size_t)threads : 1;
    if (parts > CQ_POOL_MAX_SLOTS) parts = CQ_POOL_MAX_SLOTS;
    read_job *j = (read_job *)malloc(sizeof(read_job));
    if (!j) return 0;
    j->p = p;
    j->nblk = n / BLK;
    j->panel = (size_t)S * CQ_LANE_BYTES / BLK; /* blocks a panel */
    j->S = S;
    cq_pool_run(parts, read_slot, j);
    uint64_t total = 0;
    for (size_t t = 0; t < parts; t++) total += j->sums[t];
    free(j);
    for (size_t i = (n / BLK) * BLK; i < n; i++) total += p[i];
    return total;
}
