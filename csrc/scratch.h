/* scratch.h -- per-thread scratch for a kernel's parallel region. Allocated once per
 * thread per call (never per row); a failed allocation sets *failed, the thread skips
 * its tasks and the kernel returns CQ_ERR_NOMEM. */
#ifndef CQ_SCRATCH_H
#define CQ_SCRATCH_H
#include <stdlib.h>

static inline float *cq_thread_scratch(size_t bytes, int *failed) {
    float *p = (float *)malloc(bytes ? bytes : sizeof(float));
    if (!p) {
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp atomic write
#endif
        *failed = 1;
    }
    return p;
}
#endif
