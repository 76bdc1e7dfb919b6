/* ggml_kq_decode_neon.h -- the K-quants' float32 path of the NEON tables (neon and
 * neon_dotprod: dot_row and dequant_row), and the bit splitting their int8 rows
 * (ggml_kq_neon.h) share. Included by matvec_neon_impl.h.
 *
 * A block's weights are first split into their signed integers q, 32 at a time (one
 * group j of 32: two registers of 16 int8; q2_k 0..3, q3_k -4..3, q4_k 0..15, q5_k
 * 0..31, q6_k -32..31, iq4_xs its levels -127..113), by shifts, masks and (iq4_xs) a
 * table lookup; the scales come from kq_block_scales, the scalar reference's own code.
 * Each 16 weights then become float32 with the reference decoder's operations:
 * S = d * sc and M = dmin * mn as float32 products, the weight (S * q) and, with mins,
 * minus M: a multiply and a subtract, never fused (every file is compiled with
 * -ffp-contract=off). So dequant_row equals kq_decode_block bit for bit, and the row
 * dot, which meets x with FMAs in four 4-lane accumulators, is within float32
 * rounding of kq_ref_row (the x86 tables' contract, ggml_kq_decode_avx2.h). */
#ifndef CQ_GGML_KQ_DECODE_NEON_H
#define CQ_GGML_KQ_DECODE_NEON_H

/* q4_k / q5_k: the 32 weights of group j (0..7) of the block at blk. */
static inline void kq_neon_q45(const uint8_t *blk, int q5, int j, int8x16_t *qa, int8x16_t *qb) {
    const uint8_t *qs = blk + (q5 ? 48 : 16) + 32 * (j / 2); /* low nibbles: even j, high: odd */
    uint8x16_t a = vld1q_u8(qs), b = vld1q_u8(qs + 16);
    if (j & 1) {
        a = vshrq_n_u8(a, 4);
        b = vshrq_n_u8(b, 4);
    } else {
        a = vandq_u8(a, vdupq_n_u8(0x0F));
        b = vandq_u8(b, vdupq_n_u8(0x0F));
    }
    if (q5) { /* bit j of qh[k]: weight 32j + k's fifth bit */
        const int8x16_t sh = vdupq_n_s8((int8_t)(4 - j)); /* (qh >> j) & 1, moved to bit 4 */
        const uint8x16_t m10 = vdupq_n_u8(0x10);
        const uint8x16_t ha = vld1q_u8(blk + 16), hb = vld1q_u8(blk + 32);
        a = vorrq_u8(a, vandq_u8(vshlq_u8(ha, sh), m10));
        b = vorrq_u8(b, vandq_u8(vshlq_u8(hb, sh), m10));
    }
    *qa = vreinterpretq_s8_u8(a);
    *qb = vreinterpretq_s8_u8(b);
}

/* q6_k: the 32 weights of group j = 4h + s: the low nibbles of ql[64h + 32(s % 2) ..]
 * (s < 2) or its high ones (s >= 2), bits 2s.. of qh[32h ..] as bits 4-5, minus 32. */
static inline void kq_neon_q6(const uint8_t *blk, int j, int8x16_t *qa, int8x16_t *qb) {
    const int h = j / 4, s = j % 4;
    const uint8_t *ql = blk + 64 * h + 32 * (s % 2), *qh = blk + 128 + 32 * h;
    uint8x16_t a = vld1q_u8(ql), b = vld1q_u8(ql + 16);
    if (s >= 2) {
        a = vshrq_n_u8(a, 4);
        b = vshrq_n_u8(b, 4);
    } else {
        a = vandq_u8(a, vdupq_n_u8(0x0F));
        b = vandq_u8(b, vdupq_n_u8(0x0F));
    }
    const int8x16_t sh = vdupq_n_s8((int8_t)(4 - 2 * s)); /* (qh >> 2s) & 3, moved to bits 4-5 */
    const uint8x16_t m30 = vdupq_n_u8(0x30);
    a = vorrq_u8(a, vandq_u8(vshlq_u8(vld1q_u8(qh), sh), m30));
    b = vorrq_u8(b, vandq_u8(vshlq_u8(vld1q_u8(qh + 16), sh), m30));
    *qa = vsubq_s8(vreinterpretq_s8_u8(a), vdupq_n_s8(32));
    *qb = vsubq_s8(vreinterpretq_s8_u8(b), vdupq_n_s8(32));
}

/* q2_k / q3_k: the 32 weights of group j = 4h + s: bits 2s.. of qs[32h ..]; q3_k adds
 * bit j of hmask[k] as bit 2 and subtracts 4 (low - (high ? 0 : 4) == (low | high << 2) - 4). */
static inline void kq_neon_q23(const uint8_t *blk, int q3, int j, int8x16_t *qa, int8x16_t *qb) {
    const int h = j / 4, s = j % 4;
    const uint8_t *qs = blk + (q3 ? 32 : 16) + 32 * h;
    const int8x16_t sh = vdupq_n_s8((int8_t)(-2 * s)); /* a negative vshl shifts right */
    const uint8x16_t m3 = vdupq_n_u8(3);
    uint8x16_t a = vandq_u8(vshlq_u8(vld1q_u8(qs), sh), m3), b = vandq_u8(vshlq_u8(vld1q_u8(qs + 16), sh), m3);
    if (q3) {
        const int8x16_t hs = vdupq_n_s8((int8_t)(2 - j)); /* (hmask >> j) & 1, moved to bit 2 */
        const uint8x16_t m4 = vdupq_n_u8(4);
        a = vorrq_u8(a, vandq_u8(vshlq_u8(vld1q_u8(blk), hs), m4));
        b = vorrq_u8(b, vandq_u8(vshlq_u8(vld1q_u8(blk + 16), hs), m4));
        *qa = vsubq_s8(vreinterpretq_s8_u8(a), vdupq_n_s8(4));
        *qb = vsubq_s8(vreinterpretq_s8_u8(b), vdupq_n_s8(4));
        return;
    }
    *qa = vreinterpretq_s8_u8(a);
    *qb = vreinterpretq_s8_u8(b);
}

/* iq4_xs: the 32 weights of group j: the levels of the low nibbles of qs[16j ..]
 * (weights 32j ..) and of their high nibbles (32j + 16 ..). */
static inline void kq_neon_iq4(const uint8_t *blk, int j, int8x16_t *qa, int8x16_t *qb) {
    const int8x16_t levels = vld1q_s8(KQ_IQ4_LEVELS);
    const uint8x16_t v = vld1q_u8(blk + 8 + 16 * j);
    *qa = vqtbl1q_s8(levels, vandq_u8(v, vdupq_n_u8(0x0F)));
    *qb = vqtbl1q_s8(levels, vshrq_n_u8(v, 4));
}

/* One block at blk: its 256 integers q in column order, the float32 scale of each 16
 * weights S[s] = d * sc_s and their min term M[s] = dmin * mn_s (0 without mins). */
static void kq_neon_block(int dtype, const uint8_t *blk, int8_t *q, float *S, float *M) {
    kq_ints t;
    kq_block_scales(dtype, blk, &t);
    for (int s = 0; s < 16; s++) {
        S[s] = t.d * (float)t.sc[s];
        M[s] = t.dmin * (float)t.mn[s];
    }
    for (int j = 0; j < 8; j++) {
        int8x16_t qa, qb;
        switch (dtype) {
        case CQ_DT_GGML_Q4_K: kq_neon_q45(blk, 0, j, &qa, &qb); break;
        case CQ_DT_GGML_Q5_K: kq_neon_q45(blk, 1, j, &qa, &qb); break;
        case CQ_DT_GGML_Q6_K: kq_neon_q6(blk, j, &qa, &qb); break;
        case CQ_DT_GGML_Q2_K: kq_neon_q23(blk, 0, j, &qa, &qb); break;
        case CQ_DT_GGML_Q3_K: kq_neon_q23(blk, 1, j, &qa, &qb); break;
        default: kq_neon_iq4(blk, j, &qa, &qb); break;
        }
        vst1q_s8(q + 32 * j, qa);
        vst1q_s8(q + 32 * j + 16, qb);
    }
}

/* The 16 float32 weights s of a split block (kq_decode_block's operations, in w[4]). */
static inline void kq_neon_weights16(const int8_t *q, const float *S, const float *M, int mins, int s, float32x4_t w[4]) {
    float32x4_t f[4];
    i8_f32x16(vld1q_s8(q + 16 * s), f);
    for (int k = 0; k < 4; k++) {
        w[k] = vmulq_n_f32(f[k], S[s]);
        if (mins) w[k] = vsubq_f32(w[k], vdupq_n_f32(M[s]));
    }
}

/* Row r's weights into out[cols]: bit for bit kq_ref_row's. */
static void kq_dequant_row_neon(const cq_qmat *m, size_t r, float *out) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    const int mins = kq_has_min(m->dtype);
    int8_t q[CQ_KQ_BLOCK];
    float S[16], M[16];
    for (size_t i = 0; i < nb; i++) {
        kq_neon_block(m->dtype, row + i * bb, q, S, M);
        float *o = out + CQ_KQ_BLOCK * i;
        for (int s = 0; s < 16; s++) {
            float32x4_t w[4];
            kq_neon_weights16(q, S, M, mins, s, w);
            for (int k = 0; k < 4; k++) cq_st4(o + 16 * s + 4 * k, w[k]);
        }
    }
}

/* Row r . x: each block split, its weights formed 16 at a time and met by FMA, the
 * four quarters of each 16 in their own accumulator. */
static float kq_dot_row_neon(const cq_qmat *m, size_t r, const float *x) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    const int mins = kq_has_min(m->dtype);
    float32x4_t a[4] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    int8_t q[CQ_KQ_BLOCK];
    float S[16], M[16];
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *blk = row + i * bb;
        if (i + 2 < nb)
            for (size_t o = 0; o < bb; o += 64) __builtin_prefetch(blk + 2 * bb + o, 0, 3);
        kq_neon_block(m->dtype, blk, q, S, M);
        const float *xb = x + CQ_KQ_BLOCK * i;
        for (int s = 0; s < 16; s++) {
            float32x4_t w[4];
            kq_neon_weights16(q, S, M, mins, s, w);
            for (int k = 0; k < 4; k++) a[k] = vfmaq_f32(a[k], w[k], cq_ld4(xb + 16 * s + 4 * k));
        }
    }
    return vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
}
#endif
