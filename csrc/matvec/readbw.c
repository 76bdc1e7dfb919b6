/* readbw.c -- the memory read-bandwidth probe of benchmarks/bench_matvec.py: a plain
 * 64-bit integer sum over a buffer (integer adds vectorize at baseline flags), split
 * statically over `threads` OpenMP threads. Not part of any kernel table. */
#include "../cortiq.h"
#include <string.h>
#ifdef CORTIQ_HAVE_OPENMP
#include <omp.h>
#endif

uint64_t cq_read_sum(const uint8_t *p, size_t n, int threads) {
    size_t words = n / 8;
    uint64_t total = 0;
    long nblk = (long)(words / 4096);
    (void)threads;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1) reduction(+ : total)
#endif
    for (long b = 0; b < nblk; b++) {
        const uint64_t *w = (const uint64_t *)(const void *)(p + (size_t)b * 4096 * 8);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i < 4096; i += 4) {
            s0 += w[i]; s1 += w[i + 1]; s2 += w[i + 2]; s3 += w[i + 3];
        }
        total += s0 + s1 + s2 + s3;
    }
    for (size_t i = (size_t)nblk * 4096 * 8; i < n; i++) total += p[i];
    return total;
}
