/* ggml_kq_neon.h -- the K-quants' int8-activation rows of the NEON tables (x in the
 * CQ_XQ_Q8 layout), included by matvec_neon_impl.h for both neon and neon_dotprod:
 * q4_k, q5_k and q6_k here, the other K-quants the scalar spec (kq_ref_i8_row).
 *
 * A block's weights are split into their signed integers q (q4_k 0..15, q5_k 0..31,
 * q6_k -32..31, all int8) 16 to a register, one register per half group; each half's
 * sum q * xq is sdot16 (sdot on neon_dotprod, smull + sadalp otherwise: exact either
 * way) and its sum of xq a widening add across the lanes. The spec's integers isum and
 * msum are then formed from them and combined with its float32 operations in its group
 * order, so these rows equal kq_ref_i8_row bit for bit on both tables. */
#ifndef CQ_GGML_KQ_NEON_H
#define CQ_GGML_KQ_NEON_H

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

static float kq_neon_row(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const size_t nb = m->cols / CQ_KQ_BLOCK, bb = kq_block_bytes(m->dtype);
    const uint8_t *row = m->data + r * nb * bb;
    const int q6 = m->dtype == CQ_DT_GGML_Q6_K, q5 = m->dtype == CQ_DT_GGML_Q5_K;
    /* group j's term goes into lane j and the lanes are summed in kq_ref_i8_row's tree */
    float l[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t i = 0; i < nb; i++) {
        const uint8_t *blk = row + i * bb;
        if (i + 1 < nb) __builtin_prefetch(blk + bb + 64, 0, 3);
        int sc[16], mn[16];
        float d, dmin = 0.0f;
        if (q6) {
            d = cq_h2f(cq_ld16(blk + 208));
            for (int s = 0; s < 16; s++) sc[s] = (int8_t)blk[192 + s];
        } else {
            d = cq_h2f(cq_ld16(blk));
            dmin = cq_h2f(cq_ld16(blk + 2));
            for (int j = 0; j < 8; j++) {
                kq_scale_min6(blk + 4, j, &sc[2 * j], &mn[2 * j]);
                sc[2 * j + 1] = sc[2 * j];
                mn[2 * j + 1] = mn[2 * j];
            }
        }
        for (int j = 0; j < 8; j++) {
            const size_t g = 8 * i + (size_t)j;
            const int8_t *xg = xq->q + 32 * g;
            const int8x16_t xa = vld1q_s8(xg), xb = vld1q_s8(xg + 16);
            int8x16_t qa, qb;
            if (q6) kq_neon_q6(blk, j, &qa, &qb);
            else kq_neon_q45(blk, q5, j, &qa, &qb);
            const int32_t sa = vaddvq_s32(sdot16(vdupq_n_s32(0), qa, xa));
            const int32_t sb = vaddvq_s32(sdot16(vdupq_n_s32(0), qb, xb));
            const int32_t isum = sc[2 * j] * sa + sc[2 * j + 1] * sb;
            if (q6) {
                l[j] += (d * xq->d[g]) * (float)isum;
            } else {
                const int32_t msum = mn[2 * j] * (int32_t)vaddlvq_s8(xa) + mn[2 * j + 1] * (int32_t)vaddlvq_s8(xb);
                l[j] += xq->d[g] * (d * (float)isum - dmin * (float)msum);
            }
        }
    }
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static void kq_i8_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    const int fast = m->dtype == CQ_DT_GGML_Q4_K || m->dtype == CQ_DT_GGML_Q5_K || m->dtype == CQ_DT_GGML_Q6_K;
    for (size_t j = 0; j < nr; j++) out[j] = fast ? kq_neon_row(m, r0 + j, xq) : kq_ref_i8_row(m, r0 + j, xq);
}
#endif
