/* ggml_q32_neon.h -- NEON rows of the 32-weight ggml block formats. Included by
 * matvec_neon_impl.h.
 *
 * int8: each block's codes (every format's fit in a signed byte: ggml_q32_codes) meet
 * CQ_XQ_G32's xq by sdot where the build has dotprod, else by widening multiplies; the
 * block's exact integer sum then goes through the reference's float operations in its
 * order, so rows equal ggml_q32_ref_i8_row bit for bit.
 * Exact: the codes widened to float32 four at a time, the weights d * q (or
 * (d * q) + m) rounded as the reference rounds them, then FMAs against x into four
 * accumulators: the weights' bits, summed in another order. */
#ifndef CQ_GGML_Q32_NEON_H
#define CQ_GGML_Q32_NEON_H
#include "ggml_q32_scalar.h"

/* sum_k a_k * b_k over 16 signed bytes, per 4-lane partial sums added to acc. */
static inline int32x4_t g32_dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_s8(vget_high_s8(a), vget_high_s8(b));
    return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

/* A block's codes as signed bytes, columns 0-15 (*a) and 16-31 (*b). */
static inline void g32_codes_neon(int dt, const uint8_t *p, int8x16_t *pa, int8x16_t *pb) {
    const int min = ggml_q32_has_min(dt);
    const int8x16_t lv = vld1q_s8(GGML_IQ4NL_LEVELS);
    const uint8x16_t m0f = vdupq_n_u8(0x0F);
    int8x16_t a, b;
    if (dt == CQ_DT_GGML_Q8_0) {
        a = vld1q_s8((const int8_t *)(p + 2));
        b = vld1q_s8((const int8_t *)(p + 18));
    } else {
        const int q5 = dt == CQ_DT_GGML_Q5_0 || dt == CQ_DT_GGML_Q5_1;
        const uint8_t *qs = p + 2 + 2 * min + 4 * q5;
        const uint8x16_t v = vld1q_u8(qs);
        uint8x16_t ua = vandq_u8(v, m0f), ub = vshrq_n_u8(v, 4);
        if (q5) {
            const uint8_t *qh = p + 2 + 2 * min;
            const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
            const uint8x16_t h01 = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
            const uint8x16_t h23 = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
            ua = vorrq_u8(ua, vandq_u8(vtstq_u8(h01, bit), vdupq_n_u8(16)));
            ub = vorrq_u8(ub, vandq_u8(vtstq_u8(h23, bit), vdupq_n_u8(16)));
        }
        if (dt == CQ_DT_GGML_IQ4_NL) {
            a = vqtbl1q_s8(lv, ua);
            b = vqtbl1q_s8(lv, ub);
        } else {
            const int8x16_t o = vdupq_n_s8(min ? 0 : q5 ? 16 : 8);
            a = vsubq_s8(vreinterpretq_s8_u8(ua), o);
            b = vsubq_s8(vreinterpretq_s8_u8(ub), o);
        }
    }
    *pa = a;
    *pb = b;
}

static float g32_i8_row_neon(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const int dt = m->dtype, min = ggml_q32_has_min(dt);
    const size_t gpr = m->cols / CQ_GROUP, bb = ggml_q32_block_bytes(dt);
    const uint8_t *p = m->data + r * gpr * bb;
    float acc = 0.0f;
    for (size_t g = 0; g < gpr; g++, p += bb) {
        const int8_t *x = xq->q + CQ_GROUP * g;
        int8x16_t a, b;
        g32_codes_neon(dt, p, &a, &b);
        int32x4_t s = g32_dot16(vdupq_n_s32(0), a, vld1q_s8(x));
        s = g32_dot16(s, b, vld1q_s8(x + 16));
        const float d = cq_h2f(cq_ld16(p));
        acc += (d * xq->d[g]) * (float)vaddvq_s32(s);
        if (min) acc += (cq_h2f(cq_ld16(p + 2)) * xq->d[g]) * (float)(xq->bias[2 * g] + xq->bias[2 * g + 1]);
    }
    return acc;
}

/* Four widened codes times d (plus m), the reference's rounding. */
static inline float32x4_t g32_w4(int16x4_t q, float d, float mn, int min) {
    const float32x4_t w = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(q)), d);
    return min ? vaddq_f32(w, vdupq_n_f32(mn)) : w;
}

static float g32_dot_neon(const cq_qmat *m, size_t r, const float *x) {
    const int dt = m->dtype, min = ggml_q32_has_min(dt);
    const size_t gpr = m->cols / CQ_GROUP, bb = ggml_q32_block_bytes(dt);
    const uint8_t *p = m->data + r * gpr * bb;
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    for (size_t g = 0; g < gpr; g++, p += bb, x += CQ_GROUP) {
        int8x16_t a, b;
        g32_codes_neon(dt, p, &a, &b);
        const float d = cq_h2f(cq_ld16(p)), mn = min ? cq_h2f(cq_ld16(p + 2)) : 0.0f;
        const int16x8_t al = vmovl_s8(vget_low_s8(a)), ah = vmovl_s8(vget_high_s8(a));
        const int16x8_t bl = vmovl_s8(vget_low_s8(b)), bh = vmovl_s8(vget_high_s8(b));
        a0 = vfmaq_f32(a0, g32_w4(vget_low_s16(al), d, mn, min), vld1q_f32(x));
        a1 = vfmaq_f32(a1, g32_w4(vget_high_s16(al), d, mn, min), vld1q_f32(x + 4));
        a2 = vfmaq_f32(a2, g32_w4(vget_low_s16(ah), d, mn, min), vld1q_f32(x + 8));
        a3 = vfmaq_f32(a3, g32_w4(vget_high_s16(ah), d, mn, min), vld1q_f32(x + 12));
        a0 = vfmaq_f32(a0, g32_w4(vget_low_s16(bl), d, mn, min), vld1q_f32(x + 16));
        a1 = vfmaq_f32(a1, g32_w4(vget_high_s16(bl), d, mn, min), vld1q_f32(x + 20));
        a2 = vfmaq_f32(a2, g32_w4(vget_low_s16(bh), d, mn, min), vld1q_f32(x + 24));
        a3 = vfmaq_f32(a3, g32_w4(vget_high_s16(bh), d, mn, min), vld1q_f32(x + 28));
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
}

static void ggml_q32_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    for (size_t j = 0; j < nr; j++) out[j] = g32_i8_row_neon(m, r0 + j, xq);
}
#endif
