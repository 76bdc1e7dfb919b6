/* scratch.h -- scratch for one slot of a parallel kernel (pool.h). Allocated once per
 * slot per call (never per row); a failed allocation sets *failed, the slot skips its
 * work and the kernel returns CQ_ERR_NOMEM. */
#ifndef CQ_SCRATCH_H
#define CQ_SCRATCH_H
#include "pool.h"
#include <stdlib.h>

static inline float *cq_thread_scratch(size_t bytes, int *failed) {
    float *p = (float *)malloc(bytes ? bytes : sizeof(float));
    if (!p) cq_pool_flag(failed);
    return p;
}
#endif
