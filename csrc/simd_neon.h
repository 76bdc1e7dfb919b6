/* simd_neon.h -- small NEON helpers shared by the *_neon.c twins (horizontal sums, the
 * four-accumulator dot, the Cephes exp on 4 lanes). Include only from files compiled for
 * AArch64 (every AArch64 CPU has Advanced SIMD: the armv8-a baseline). */
#ifndef CQ_SIMD_NEON_H
#define CQ_SIMD_NEON_H
#if !defined(__aarch64__) && !defined(_M_ARM64)
#error "simd_neon.h is for AArch64 translation units"
#endif
#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>
#include "mathfn/exp8.h"

/* Unaligned loads and stores through byte pointers (no alignment is assumed anywhere). */
static inline float32x4_t cq_ld4(const float *p) { return vld1q_f32(p); }
static inline void cq_st4(float *p, float32x4_t v) { vst1q_f32(p, v); }

/* sum a[i]*b[i] with four 4-lane FMA accumulators over 16-element steps, 4-element
 * steps into the first, then a scalar tail: the order every NEON dot in cortiq uses. */
static inline float cq_dot4(const float *a, const float *b, size_t n) {
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, cq_ld4(a + i), cq_ld4(b + i));
        s1 = vfmaq_f32(s1, cq_ld4(a + i + 4), cq_ld4(b + i + 4));
        s2 = vfmaq_f32(s2, cq_ld4(a + i + 8), cq_ld4(b + i + 8));
        s3 = vfmaq_f32(s3, cq_ld4(a + i + 12), cq_ld4(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, cq_ld4(a + i), cq_ld4(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y[i] += a * x[i] (FMA on 4 lanes, scalar tail mul + add). */
static inline void cq_axpy4(float *y, float a, const float *x, size_t n) {
    const float32x4_t va = vdupq_n_f32(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        cq_st4(y + i, vfmaq_f32(cq_ld4(y + i), va, cq_ld4(x + i)));
        cq_st4(y + i + 4, vfmaq_f32(cq_ld4(y + i + 4), va, cq_ld4(x + i + 4)));
    }
    for (; i + 4 <= n; i += 4) cq_st4(y + i, vfmaq_f32(cq_ld4(y + i), va, cq_ld4(x + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* exp on 4 lanes: the vector form of cq_exp1 with FMA (within rounding of it, not bit
 * for bit). FMIN/FMAX return NaN when either operand is NaN, so a NaN lane propagates
 * through the clamp and the result. */
static inline float32x4_t cq_exp4(float32x4_t x) {
    const float32x4_t v = vmaxq_f32(vdupq_n_f32(CQ_EXP_LO), vminq_f32(vdupq_n_f32(CQ_EXP_HI), x));
    const float32x4_t n = vrndmq_f32(vfmaq_f32(vdupq_n_f32(0.5f), v, vdupq_n_f32(CQ_LOG2E)));
    float32x4_t g = vfmsq_f32(v, n, vdupq_n_f32(CQ_EXP_C1));
    g = vfmsq_f32(g, n, vdupq_n_f32(CQ_EXP_C2));
    float32x4_t p = vdupq_n_f32(CQ_EXP_P0);
    p = vfmaq_f32(vdupq_n_f32(CQ_EXP_P1), p, g);
    p = vfmaq_f32(vdupq_n_f32(CQ_EXP_P2), p, g);
    p = vfmaq_f32(vdupq_n_f32(CQ_EXP_P3), p, g);
    p = vfmaq_f32(vdupq_n_f32(CQ_EXP_P4), p, g);
    p = vfmaq_f32(vdupq_n_f32(CQ_EXP_P5), p, g);
    p = vfmaq_f32(vaddq_f32(g, vdupq_n_f32(1.0f)), vmulq_f32(p, g), g);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

/* cq_exp1 on 4 lanes with exactly its operations (separate multiplies and adds:
 * -ffp-contract=off keeps them apart), so every lane equals the scalar bit for bit; a
 * NaN lane returns its input, as cq_exp1 does. */
static inline float32x4_t cq_exp4_exact(float32x4_t x) {
    const float32x4_t v = vmaxq_f32(vdupq_n_f32(CQ_EXP_LO), vminq_f32(vdupq_n_f32(CQ_EXP_HI), x));
    const float32x4_t n = vrndmq_f32(vaddq_f32(vmulq_f32(v, vdupq_n_f32(CQ_LOG2E)), vdupq_n_f32(0.5f)));
    const float32x4_t g = vsubq_f32(vsubq_f32(v, vmulq_f32(n, vdupq_n_f32(CQ_EXP_C1))),
                                    vmulq_f32(n, vdupq_n_f32(CQ_EXP_C2)));
    float32x4_t p = vdupq_n_f32(CQ_EXP_P0);
    p = vaddq_f32(vmulq_f32(p, g), vdupq_n_f32(CQ_EXP_P1));
    p = vaddq_f32(vmulq_f32(p, g), vdupq_n_f32(CQ_EXP_P2));
    p = vaddq_f32(vmulq_f32(p, g), vdupq_n_f32(CQ_EXP_P3));
    p = vaddq_f32(vmulq_f32(p, g), vdupq_n_f32(CQ_EXP_P4));
    p = vaddq_f32(vmulq_f32(p, g), vdupq_n_f32(CQ_EXP_P5));
    p = vaddq_f32(vaddq_f32(vmulq_f32(vmulq_f32(p, g), g), g), vdupq_n_f32(1.0f));
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t r = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vbslq_f32(vceqq_f32(x, x), r, x);
}
#endif
