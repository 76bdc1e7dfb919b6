/* ggml_kq_neon.h -- the K-quants' int8-activation rows of the NEON tables (x in the
 * CQ_XQ_Q8 layout), included by matvec_neon_impl.h for both neon and neon_dotprod:
 * q4_k, q5_k and q6_k here, the other K-quants the scalar spec (kq_ref_i8_row).
 *
 * A block's weights are split into their signed integers q (q4_k 0..15, q5_k 0..31,
 * q6_k -32..31, all int8) 16 to a register, one register per half group, by the
 * splitters of ggml_kq_decode_neon.h (included before this file); each half's
 * sum q * xq is sdot16 (sdot on neon_dotprod, smull + sadalp otherwise: exact either
 * way) and its sum of xq a widening add across the lanes. The spec's integers isum and
 * msum are then formed from them and combined with its float32 operations in its group
 * order, so these rows equal kq_ref_i8_row bit for bit on both tables. */
#ifndef CQ_GGML_KQ_NEON_H
#define CQ_GGML_KQ_NEON_H

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
