/* nystrom_ref.c -- scalar reference of the far-field kernels (nystrom_body.h). */
#include "../cortiq.h"
#include <stddef.h>

static inline float NYS_DOT(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static inline void NYS_AXPY(float *y, float a, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}
static inline void NYS_SCALE(float *y, float a, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] *= a;
}

#include "nystrom_body.h"

const cq_nystrom_ops cq_nystrom_ref = {nys_absorb, nys_step, nys_readout, nys_seg_means};
