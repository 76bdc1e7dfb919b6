/* matvec_neon_impl.h -- the NEON matvec table, compiled twice: by matvec_neon.c
 * (armv8-a) and by matvec_neon_dotprod.c (armv8.2-a+dotprod, CQ_NEON_SDOT), whose only
 * difference is how the int8-activation rows form their integer sums (sdot, or
 * smull + sadalp). The including file defines CQ_NEON_TABLE, the table's name.
 * Numerics:
 *  - float32 x: weights decode to the exact float32 values of the reference; the dots
 *    keep four 4-lane FMA accumulators and factor the row scale (q8) or the group scale
 *    (q4/q2 families) out of the partial sums, so they differ from the reference's
 *    sequential sum at float32 rounding level only (as the x86 twins do); the ggml
 *    K-quants split a block's bits on 16 lanes and form each weight with the reference
 *    decoder's float32 operations (ggml_kq_decode_neon.h), so their dequant_row is the
 *    reference's bit for bit and their dots within float32 rounding of it;
 *  - int8 x (CQ_ACT_INT8): each group's integer sum is exact and the groups are combined
 *    in the reference's order with its float32 operations, so these rows equal
 *    ref_i8_row bit for bit, with or without sdot;
 *  - matmat: the packed GEMM of matmat_packed.h on 4 lanes (equal to matvec within
 *    float32 rounding); with int8 activations the portable i8_x.h version (t int8
 *    matvecs, bit for bit). */
#ifndef CQ_MATVEC_NEON_IMPL_H
#define CQ_MATVEC_NEON_IMPL_H
#include "qmat.h"
#include "matvec_scalar.h"
#include "../simd_neon.h"

/* 4 floats from 4, 2 or 1 byte elements at p (any alignment). */
static inline float32x4_t ld_f32x4(const uint8_t *p) { return vreinterpretq_f32_u8(vld1q_u8(p)); }
static inline float32x4_t ld_f16x4(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }
static inline float32x4_t ld_bf16x4(const uint8_t *p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vreinterpret_u16_u8(vld1_u8(p)), 16));
}
/* an f16 scale (exact: every f16 value is a float32 value) */
static inline float h2f_hw(const uint8_t *p) { return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(cq_ld16(p)))), 0); }

/* 16 int8 -> 4 x 4 floats (exact) */
static inline void i8_f32x16(int8x16_t v, float32x4_t f[4]) {
    const int16x8_t lo = vmovl_s8(vget_low_s8(v)), hi = vmovl_high_s8(v);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(lo));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(hi));
}

/* One 4-lane stream of EB-byte elements: 16 columns a step into four accumulators,
 * then 4-column steps, then the scalar tail. */
#define CQ_NEON_DOT_STREAM(LOAD, EB, SCALAR)                                              \
    do {                                                                                  \
        float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;                    \
        size_t c = 0;                                                                     \
        for (; c + 16 <= cols; c += 16) {                                                 \
            a0 = vfmaq_f32(a0, LOAD(p + c * EB), cq_ld4(x + c));                          \
            a1 = vfmaq_f32(a1, LOAD(p + (c + 4) * EB), cq_ld4(x + c + 4));                \
            a2 = vfmaq_f32(a2, LOAD(p + (c + 8) * EB), cq_ld4(x + c + 8));                \
            a3 = vfmaq_f32(a3, LOAD(p + (c + 12) * EB), cq_ld4(x + c + 12));              \
        }                                                                                 \
        for (; c + 4 <= cols; c += 4) a0 = vfmaq_f32(a0, LOAD(p + c * EB), cq_ld4(x + c)); \
        acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));                \
        for (; c < cols; c++) acc += (SCALAR) * x[c];                                     \
    } while (0)

/* sum q[c] * x[c] over an int8 row (q8_row; q8_2f against col * x) */
static float q8_dot(const uint8_t *p, const float *x, size_t cols) {
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    size_t c = 0;
    for (; c + 16 <= cols; c += 16) {
        float32x4_t f[4];
        i8_f32x16(vld1q_s8((const int8_t *)p + c), f);
        a0 = vfmaq_f32(a0, f[0], cq_ld4(x + c));
        a1 = vfmaq_f32(a1, f[1], cq_ld4(x + c + 4));
        a2 = vfmaq_f32(a2, f[2], cq_ld4(x + c + 8));
        a3 = vfmaq_f32(a3, f[3], cq_ld4(x + c + 12));
    }
    float acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3)));
    for (; c < cols; c++) acc += (float)(int8_t)p[c] * x[c];
    return acc;
}

/* 16 bytes of nibbles (element 2k low, 2k+1 high of byte k) -> 32 int8 in column
 * order, minus 8: a = elements 0..15, b = 16..31. */
static inline void q4_unpack(const uint8_t *p, int8x16_t *a, int8x16_t *b) {
    const uint8x16_t v = vld1q_u8(p), lo = vandq_u8(v, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(v, 4);
    *a = vsubq_s8(vreinterpretq_s8_u8(vzip1q_u8(lo, hi)), vdupq_n_s8(8));
    *b = vsubq_s8(vreinterpretq_s8_u8(vzip2q_u8(lo, hi)), vdupq_n_s8(8));
}
/* 8 bytes of 2-bit fields (element 4k+j = bits 2j.. of byte k) -> 32 int8 (2v - 3). */
static inline void q2_unpack(const uint8_t *p, int8x16_t *a, int8x16_t *b) {
    const uint8x8_t v = vld1_u8(p), m = vdup_n_u8(3);
    const uint8x8x2_t z01 = vzip_u8(vand_u8(v, m), vand_u8(vshr_n_u8(v, 2), m));
    const uint8x8x2_t z23 = vzip_u8(vand_u8(vshr_n_u8(v, 4), m), vshr_n_u8(v, 6));
    const uint16x8_t A = vreinterpretq_u16_u8(vcombine_u8(z01.val[0], z01.val[1]));
    const uint16x8_t B = vreinterpretq_u16_u8(vcombine_u8(z23.val[0], z23.val[1]));
    const int8x16_t three = vdupq_n_s8(3);
    *a = vsubq_s8(vreinterpretq_s8_u8(vshlq_n_u8(vreinterpretq_u8_u16(vzip1q_u16(A, B)), 1)), three);
    *b = vsubq_s8(vreinterpretq_s8_u8(vshlq_n_u8(vreinterpretq_u8_u16(vzip2q_u16(A, B)), 1)), three);
}

/* sum over one group of 32 of q * x (q from a, b), two chains */
static inline float32x4_t grp_dot(int8x16_t a, int8x16_t b, const float *x) {
    float32x4_t fa[4], fb[4];
    i8_f32x16(a, fa);
    i8_f32x16(b, fb);
    float32x4_t s0 = vmulq_f32(fa[0], cq_ld4(x)), s1 = vmulq_f32(fa[1], cq_ld4(x + 4));
    s0 = vfmaq_f32(s0, fa[2], cq_ld4(x + 8));
    s1 = vfmaq_f32(s1, fa[3], cq_ld4(x + 12));
    s0 = vfmaq_f32(s0, fb[0], cq_ld4(x + 16));
    s1 = vfmaq_f32(s1, fb[1], cq_ld4(x + 20));
    s0 = vfmaq_f32(s0, fb[2], cq_ld4(x + 24));
    s1 = vfmaq_f32(s1, fb[3], cq_ld4(x + 28));
    return vaddq_f32(s0, s1);
}

/* Can the grouped fast path run (groups aligned to rows)? */
static inline int grouped_fast(const cq_qmat *m) {
    switch (m->dtype) {
    case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP: case CQ_DT_Q2TP:
        return m->cols % CQ_GROUP == 0;
    default: return 0; /* vbit/vbit_ro and odd shapes: the scalar decoder */
    }
}

/* Group g of row r of a grouped dtype (cols % 32 == 0): its weight bytes. */
static inline const uint8_t *grp_bytes(const cq_qmat *m, size_t r, size_t g) {
    const size_t gpr = m->cols / CQ_GROUP, i = r * gpr + g;
    switch (m->dtype) {
    case CQ_DT_Q4_TILED: return m->data + 18 * i + 2;
    case CQ_DT_Q2TP: return m->data + 8 * i;
    default: return m->data + 16 * i; /* q4_block, q4tp */
    }
}

/* sw[0 .. ng) = the scales of groups g0 .. g0+ng-1 of row r, as the reference decodes
 * them (f16 exactly; tile codes through the ladder). */
static void neon_group_scales(const cq_qmat *m, size_t r, size_t g0, size_t ng, float *sw) {
    const size_t gpr = m->cols / CQ_GROUP;
    const uint8_t *d = m->data;
    size_t k = 0;
    switch (m->dtype) {
    case CQ_DT_Q4_BLOCK: {
        const uint8_t *sp = d + 16 * m->rows * gpr + 2 * (r * gpr + g0);
        for (; k + 4 <= ng; k += 4) cq_st4(sw + k, ld_f16x4(sp + 2 * k));
        for (; k < ng; k++) sw[k] = h2f_hw(sp + 2 * k);
        break;
    }
    case CQ_DT_Q4_TILED:
        for (; k < ng; k++) sw[k] = h2f_hw(d + 18 * (r * gpr + g0 + k));
        break;
    default: { /* q4tp, q2tp */
        const size_t stride = cq_tp_stride(m->cols);
        const uint8_t *cb = d + m->rows * gpr * cq_tp_tile(m->dtype) + 4 * m->rows + r * stride;
        for (; k < ng; k++) sw[k] = m->aux[32 * r + tp_code(cb, stride, g0 + k)];
    }
    }
}

static inline void grp_unpack(int q2, const uint8_t *p, int8x16_t *a, int8x16_t *b) {
    if (q2) q2_unpack(p, a, b);
    else q4_unpack(p, a, b);
}

/* A grouped row (cols % 32 == 0): per group gs = sum q*x, then acc += gs * scale (two
 * alternating accumulators); q2tp's 0.5 applied once at the end. */
static float grouped_dot(const cq_qmat *m, size_t r, const float *x) {
    const size_t gpr = m->cols / CQ_GROUP;
    const int q2 = m->dtype == CQ_DT_Q2TP;
    float32x4_t t0 = vdupq_n_f32(0.0f), t1 = t0;
    float sw[64];
    for (size_t g0 = 0; g0 < gpr; g0 += 64) {
        const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;
        neon_group_scales(m, r, g0, ng, sw);
        for (size_t gi = 0; gi < ng; gi++) {
            const size_t g = g0 + gi;
            int8x16_t a, b;
            grp_unpack(q2, grp_bytes(m, r, g), &a, &b);
            const float32x4_t gs = grp_dot(a, b, x + CQ_GROUP * g);
            if (gi & 1) t1 = vfmaq_n_f32(t1, gs, sw[gi]);
            else t0 = vfmaq_n_f32(t0, gs, sw[gi]);
        }
    }
    const float acc = vaddvq_f32(vaddq_f32(t0, t1));
    return q2 ? acc * 0.5f : acc;
}

#include "ggml_q32_neon.h"
#include "ggml_kq_decode_neon.h"

static float dot_row(const cq_qmat *m, size_t r, const float *x) {
    const size_t cols = m->cols;
    float acc = 0.0f;
    switch (m->dtype) {
    case CQ_DT_F32: {
        const uint8_t *p = m->data + 4 * r * cols;
        CQ_NEON_DOT_STREAM(ld_f32x4, 4, cq_ldf32(p + 4 * c));
        return acc;
    }
    case CQ_DT_F16: {
        const uint8_t *p = m->data + 2 * r * cols;
        CQ_NEON_DOT_STREAM(ld_f16x4, 2, cq_h2f(cq_ld16(p + 2 * c)));
        return acc;
    }
    case CQ_DT_BF16: {
        const uint8_t *p = m->data + 2 * r * cols;
        CQ_NEON_DOT_STREAM(ld_bf16x4, 2, cq_bf2f(cq_ld16(p + 2 * c)));
        return acc;
    }
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: /* x is col * x for q8_2f (prep_x): rs * sum q * xp */
        return q8_dot(m->data + r * cols, x, cols) * m->aux[r];
    default: break;
    }
    if (kq_is(m->dtype)) return kq_dot_row_neon(m, r, x);
    if (ggml_q32_block_bytes(m->dtype)) return g32_dot_neon(m, r, x);
    if (!grouped_fast(m)) return ref_row(m, r, x, NULL);
    return grouped_dot(m, r, x);
}

/* Columns [c0, c1) of row r into out[0 .. c1 - c0); for the grouped dtypes c0 is a
 * multiple of 32 and c1 one too or cols; dtypes the reference decodes (vbit, grouped
 * dtypes with cols % 32 != 0) take whole rows only. Exact: the reference's values. */
static void neon_dequant_span(const cq_qmat *m, size_t r, size_t c0, size_t c1, float *out) {
    const size_t cols = m->cols;
    size_t c = c0;
    switch (m->dtype) {
    case CQ_DT_F32:
        memcpy(out, m->data + 4 * (r * cols + c0), (c1 - c0) * sizeof(float));
        return;
    case CQ_DT_F16: {
        const uint8_t *p = m->data + 2 * r * cols;
        for (; c + 4 <= c1; c += 4) cq_st4(out + (c - c0), ld_f16x4(p + 2 * c));
        for (; c < c1; c++) out[c - c0] = cq_h2f(cq_ld16(p + 2 * c));
        return;
    }
    case CQ_DT_BF16: {
        const uint8_t *p = m->data + 2 * r * cols;
        for (; c + 4 <= c1; c += 4) cq_st4(out + (c - c0), ld_bf16x4(p + 2 * c));
        for (; c < c1; c++) out[c - c0] = cq_bf2f(cq_ld16(p + 2 * c));
        return;
    }
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: {
        const uint8_t *p = m->data + r * cols;
        const float *col = m->dtype == CQ_DT_Q8_2F ? m->aux + m->rows : NULL;
        const float s = m->aux[r];
        for (; c + 16 <= c1; c += 16) {
            float32x4_t f[4];
            i8_f32x16(vld1q_s8((const int8_t *)p + c), f);
            for (int k = 0; k < 4; k++) {
                float32x4_t w = vmulq_n_f32(f[k], s);
                if (col) w = vmulq_f32(w, cq_ld4(col + c + 4 * k));
                cq_st4(out + (c - c0) + 4 * k, w);
            }
        }
        for (; c < c1; c++) out[c - c0] = col ? ((float)(int8_t)p[c] * s) * col[c] : (float)(int8_t)p[c] * s;
        return;
    }
    default: break;
    }
    if (kq_is(m->dtype)) { /* whole rows (matmat asks no less) */
        kq_dequant_row_neon(m, r, out);
        return;
    }
    if (!grouped_fast(m)) { /* odd shapes, vbit: whole rows only (matmat asks no less) */
        (void)ref_row(m, r, NULL, out);
        return;
    }
    const size_t ga = c0 / CQ_GROUP, gb = (c1 + CQ_GROUP - 1) / CQ_GROUP;
    const int q2 = m->dtype == CQ_DT_Q2TP;
    float sw[64];
    for (size_t g0 = ga; g0 < gb; g0 += 64) {
        const size_t ng = gb - g0 < 64 ? gb - g0 : 64;
        neon_group_scales(m, r, g0, ng, sw);
        for (size_t gi = 0; gi < ng; gi++) {
            const size_t g = g0 + gi;
            int8x16_t ab[2];
            grp_unpack(q2, grp_bytes(m, r, g), &ab[0], &ab[1]);
            float *o = out + CQ_GROUP * (g - ga);
            for (int h = 0; h < 2; h++) {
                float32x4_t f[4];
                i8_f32x16(ab[h], f);
                for (int k = 0; k < 4; k++) /* q2: (2v - 3) * 0.5 is v - 1.5 exactly */
                    cq_st4(o + 16 * h + 4 * k, vmulq_n_f32(q2 ? vmulq_n_f32(f[k], 0.5f) : f[k], sw[gi]));
            }
        }
    }
}

static void dequant_row(const cq_qmat *m, size_t r, float *out) { neon_dequant_span(m, r, 0, m->cols, out); }

static int needs_prep(const cq_qmat *m) { return m->dtype == CQ_DT_Q8_2F; }

/* q8_2f: xp = col * x, so a row's dot is rs * sum q * xp. */
static void prep_x(const cq_qmat *m, const float *x, float *xp) {
    const float *col = m->aux + m->rows;
    size_t c = 0;
    for (; c + 4 <= m->cols; c += 4) cq_st4(xp + c, vmulq_f32(cq_ld4(col + c), cq_ld4(x + c)));
    for (; c < m->cols; c++) xp[c] = col[c] * x[c];
}

/* ---- int8 activations (cq_qmat.act; spec: ref_i8_row) ---- */
/* acc + the 16 products a[k] * b[k] summed into 4 int32 lanes (exact) */
static inline int32x4_t sdot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#ifdef CQ_NEON_SDOT
    return vdotq_s32(acc, a, b);
#else
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

static float i8_row_q8(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const size_t gpr = m->cols / CQ_GROUP;
    const int8_t *w = (const int8_t *)(m->data + r * m->cols);
    float acc = 0.0f;
    for (size_t g = 0; g < gpr; g++) {
        const int8_t *wg = w + CQ_GROUP * g, *qg = xq->q + CQ_GROUP * g;
        int32x4_t s = sdot16(vdupq_n_s32(0), vld1q_s8(wg), vld1q_s8(qg));
        s = sdot16(s, vld1q_s8(wg + 16), vld1q_s8(qg + 16));
        acc += xq->d[g] * (float)vaddvq_s32(s);
    }
    return acc * m->aux[r];
}

/* q4: the low nibbles meet xq's even elements, the high ones its odd elements (qmat.h:
 * CQ_XQ_Q4); q2tp: phase j of the 8 code bytes meets xq's 8 bytes of phase j. */
static float i8_row_grouped(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const size_t gpr = m->cols / CQ_GROUP;
    const int q2 = m->dtype == CQ_DT_Q2TP;
    float acc = 0.0f, sw[64];
    for (size_t g0 = 0; g0 < gpr; g0 += 64) {
        const size_t ng = gpr - g0 < 64 ? gpr - g0 : 64;
        neon_group_scales(m, r, g0, ng, sw);
        for (size_t gi = 0; gi < ng; gi++) {
            const size_t g = g0 + gi;
            const uint8_t *p = grp_bytes(m, r, g);
            int32x4_t s = vdupq_n_s32(0);
            float sg = sw[gi];
            if (q2) {
                const uint8x8_t v = vld1_u8(p), m3 = vdup_n_u8(3);
                const int8_t *qb = xq->q + 256 * (g / 8) + 8 * (g % 8);
                const int8x8_t three = vdup_n_s8(3);
#define Q2_W(j) vsub_s8(vreinterpret_s8_u8(vshl_n_u8(vand_u8(vshr_n_u8(v, 2 * (j)), m3), 1)), three)
                s = sdot16(s, vcombine_s8(vsub_s8(vreinterpret_s8_u8(vshl_n_u8(vand_u8(v, m3), 1)), three), Q2_W(1)),
                           vcombine_s8(vld1_s8(qb), vld1_s8(qb + 64)));
                s = sdot16(s, vcombine_s8(Q2_W(2), Q2_W(3)), vcombine_s8(vld1_s8(qb + 128), vld1_s8(qb + 192)));
#undef Q2_W
                sg *= 0.5f;
            } else {
                const uint8x16_t v = vld1q_u8(p);
                const int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))), vdupq_n_s8(8));
                const int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
                const int8_t *qe = xq->q + 128 * (g / 4) + 16 * (g % 4);
                s = sdot16(sdot16(s, lo, vld1q_s8(qe)), hi, vld1q_s8(qe + 64));
            }
            acc += (sg * xq->d[g]) * (float)vaddvq_s32(s);
        }
    }
    return acc;
}

#define CQ_HAVE_I8_ROWS
#include "ggml_kq_neon.h"
static void i8_dot_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    if (kq_is(m->dtype)) {
        kq_i8_rows(m, r0, nr, xq, out);
        return;
    }
    if (ggml_q32_block_bytes(m->dtype)) {
        ggml_q32_i8_rows(m, r0, nr, xq, out);
        return;
    }
    const int q8 = m->dtype == CQ_DT_Q8_ROW || m->dtype == CQ_DT_Q8_2F;
    for (size_t j = 0; j < nr; j++) out[j] = q8 ? i8_row_q8(m, r0 + j, xq) : i8_row_grouped(m, r0 + j, xq);
}

/* ---- matmat: the packed GEMM of matmat_packed.h on 4 lanes. 32 vector registers: 24
 * accumulators (8 rows x 3 vectors, 12 x 2, 24 x 1), the input vectors, a broadcast. */
#define MM_VL 4
#define MM_NV 3 /* panels of 12 inputs */
typedef float32x4_t mm_vec;
typedef size_t mm_idx;
#define mm_load vld1q_f32
#define mm_store vst1q_f32
#define mm_set1 vdupq_n_f32
#define mm_fma(a, b, c) vfmaq_f32((c), (a), (b))
#define mm_zero() vdupq_n_f32(0.0f)
#define MM_PREFETCH_L2(a) __builtin_prefetch((const void *)(a), 0, 2)
static inline mm_idx mm_gather_idx(size_t stride) { return stride; }
static inline mm_vec mm_gather(mm_idx stride, const float *base, size_t live) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t k = 0; k < live; k++) v[k] = base[k * stride];
    return vld1q_f32(v);
}
/* 4 inputs x 4 columns of X by four row loads and a register transpose */
#define MM_HAVE_PACK_BLOCK
static inline void mm_pack_block(const float *src, size_t cols, size_t live, float *dst, size_t wd) {
    float32x4_t r[4];
    for (size_t k = 0; k < 4; k++) r[k] = k < live ? vld1q_f32(src + k * cols) : vdupq_n_f32(0.0f);
    const float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
    const float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
#define CQ_F64(v) vreinterpretq_f64_f32(v)
    vst1q_f32(dst, vreinterpretq_f32_f64(vtrn1q_f64(CQ_F64(t0), CQ_F64(t2))));
    vst1q_f32(dst + wd, vreinterpretq_f32_f64(vtrn1q_f64(CQ_F64(t1), CQ_F64(t3))));
    vst1q_f32(dst + 2 * wd, vreinterpretq_f32_f64(vtrn2q_f64(CQ_F64(t0), CQ_F64(t2))));
    vst1q_f32(dst + 3 * wd, vreinterpretq_f32_f64(vtrn2q_f64(CQ_F64(t1), CQ_F64(t3))));
#undef CQ_F64
}
#define MM_SHAPES(X) X(8, 3) X(12, 2) X(24, 1)
#define mm_decode neon_dequant_span
static size_t mm_column(const cq_qmat *m, size_t c) { (void)m; return c; } /* natural order */
#include "matmat_packed.h"

#include "matvec_drivers.h"

CQ_MATVEC_OPS(CQ_NEON_TABLE);
#endif
