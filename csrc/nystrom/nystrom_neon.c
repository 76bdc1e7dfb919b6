/* nystrom_neon.c -- NEON twin of nystrom_ref.c: the same algorithm (nystrom_body.h)
 * with 4-lane FMA dot/axpy/scale and scalar tails. Differs from the reference only by
 * rounding (four accumulators in the dot, fused multiply-adds). */
#include "../cortiq.h"
#include "../simd_neon.h"
#include <stddef.h>

static inline float NYS_DOT(const float *a, const float *b, size_t n) { return cq_dot4(a, b, n); }
static inline void NYS_AXPY(float *y, float a, const float *x, size_t n) { cq_axpy4(y, a, x, n); }
static inline void NYS_SCALE(float *y, float a, size_t n) {
    const float32x4_t va = vdupq_n_f32(a);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) cq_st4(y + i, vmulq_f32(va, cq_ld4(y + i)));
    for (; i < n; i++) y[i] *= a;
}

#include "nystrom_body.h"

const cq_nystrom_ops cq_nystrom_neon = {nys_absorb, nys_step, nys_readout, nys_seg_means};
