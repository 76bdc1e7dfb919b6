/* ggml_q32_scalar.h -- the 32-weight ggml block formats (q4_0, q4_1, q5_0, q5_1, q8_0,
 * iq4_nl; docs/cmf-format.md §7.9): block sizes, the scalar decode (the spec: float32
 * values equal bit for bit to the gguf package's dequantizers, which compute d * q, or
 * (d * q) + m for the formats with a min, in float32) and the int8-activation
 * reference row. Static inline, so every ISA file compiles its own copy; every file is
 * compiled with -ffp-contract=off, so (d * q) + m is never fused. */
#ifndef CQ_GGML_Q32_SCALAR_H
#define CQ_GGML_Q32_SCALAR_H
#include "qmat.h"

/* Bytes of one block of a 32-weight ggml format, 0 for any other dtype. */
static inline size_t ggml_q32_block_bytes(int dtype) {
    switch (dtype) {
    case CQ_DT_GGML_Q4_0: return 18;
    case CQ_DT_GGML_Q4_1: return 20;
    case CQ_DT_GGML_Q5_0: return 22;
    case CQ_DT_GGML_Q5_1: return 24;
    case CQ_DT_GGML_Q8_0: return 34;
    case CQ_DT_GGML_IQ4_NL: return 18;
    default: return 0;
    }
}

/* Payload bytes of a [rows, cols] matrix: whole blocks per row, so cols % 32 == 0
 * (else 0: not a shape these formats store). */
static inline size_t ggml_q32_nbytes(int dtype, size_t rows, size_t cols) {
    if (cols % CQ_GROUP) return 0;
    return rows * (cols / CQ_GROUP) * ggml_q32_block_bytes(dtype);
}

/* iq4_nl's 16 non-uniform levels, indexed by the 4-bit code. */
static const int8_t GGML_IQ4NL_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

/* Whether a format adds a per-block min m to d * q (q4_1, q5_1; their q is unsigned). */
static inline int ggml_q32_has_min(int dtype) { return dtype == CQ_DT_GGML_Q4_1 || dtype == CQ_DT_GGML_Q5_1; }

/* Block b's integer codes q[32] in column order (signed for the formats without a
 * min: q8_0 as stored, q4_0 nibble - 8, q5_0 5-bit value - 16, iq4_nl its level), its
 * scale *d and min *mn (0 for the formats without one). Column k < 16 takes the low
 * nibble of qs[k], column 16 + k the high one; the 5-bit formats' fifth bit of
 * column k is bit k of the little-endian word qh. */
static inline void ggml_q32_codes(int dtype, const uint8_t *b, int32_t *q, float *d, float *mn) {
    *d = cq_h2f(cq_ld16(b));
    *mn = 0.0f;
    switch (dtype) {
    case CQ_DT_GGML_Q8_0:
        for (int k = 0; k < 32; k++) q[k] = (int8_t)b[2 + k];
        return;
    case CQ_DT_GGML_Q4_0:
    case CQ_DT_GGML_Q4_1:
    case CQ_DT_GGML_IQ4_NL: {
        const int min = dtype == CQ_DT_GGML_Q4_1;
        const uint8_t *qs = b + (min ? 4 : 2);
        if (min) *mn = cq_h2f(cq_ld16(b + 2));
        for (int k = 0; k < 16; k++) {
            q[k] = qs[k] & 15;
            q[16 + k] = qs[k] >> 4;
        }
        if (dtype == CQ_DT_GGML_Q4_0)
            for (int k = 0; k < 32; k++) q[k] -= 8;
        else if (dtype == CQ_DT_GGML_IQ4_NL)
            for (int k = 0; k < 32; k++) q[k] = GGML_IQ4NL_LEVELS[q[k]];
        return;
    }
    default: { /* q5_0, q5_1 */
        const int min = dtype == CQ_DT_GGML_Q5_1;
        const uint8_t *qh = b + (min ? 4 : 2), *qs = qh + 4;
        if (min) *mn = cq_h2f(cq_ld16(b + 2));
        const uint32_t h = (uint32_t)qh[0] | ((uint32_t)qh[1] << 8) | ((uint32_t)qh[2] << 16) | ((uint32_t)qh[3] << 24);
        for (int k = 0; k < 16; k++) {
            q[k] = (int32_t)((qs[k] & 15u) | (((h >> k) & 1u) << 4));
            q[16 + k] = (int32_t)((qs[k] >> 4) | (((h >> (16 + k)) & 1u) << 4));
        }
        if (!min)
            for (int k = 0; k < 32; k++) q[k] -= 16;
        return;
    }
    }
}

/* Block g of row r. */
static inline const uint8_t *ggml_q32_block(const cq_qmat *m, size_t r, size_t g) {
    const size_t bb = ggml_q32_block_bytes(m->dtype);
    return m->data + (r * (m->cols / CQ_GROUP) + g) * bb;
}

/* The weights of one block as float32: d * q, or (d * q) + m. */
static inline void ggml_q32_decode(int dtype, const uint8_t *b, float *w) {
    int32_t q[32];
    float d, mn;
    ggml_q32_codes(dtype, b, q, &d, &mn);
    if (ggml_q32_has_min(dtype))
        for (int k = 0; k < 32; k++) w[k] = d * (float)q[k] + mn;
    else
        for (int k = 0; k < 32; k++) w[k] = d * (float)q[k];
}

/* Row r decoded (out != NULL) or dotted with x in column order (ref_row's contract). */
static inline float ggml_q32_ref_row(const cq_qmat *m, size_t r, const float *x, float *out) {
    float acc = 0.0f, w[32];
    for (size_t g = 0; g < m->cols / CQ_GROUP; g++) {
        ggml_q32_decode(m->dtype, ggml_q32_block(m, r, g), w);
        if (out) memcpy(out + CQ_GROUP * g, w, sizeof w);
        else
            for (int k = 0; k < 32; k++) acc += w[k] * x[CQ_GROUP * g + k];
    }
    return acc;
}

/* The int8-activation row (x in CQ_XQ_G32), the spec of its SIMD twins. Per block g
 * the exact isum = sum_k q_k * xq_k of the codes above, then in block order
 *   acc += (d_w * d_g) * isum                        (q8_0, q4_0, q5_0, iq4_nl)
 *   acc += (d_w * d_g) * isum; acc += (m_w * d_g) * xsum_g   (q4_1, q5_1)
 * with xsum_g = bias[2g] + bias[2g + 1] the group's sum of xq. The SIMD kernels form
 * the same integers and combine the float terms in another order. */
static inline float ggml_q32_ref_i8_row(const cq_qmat *m, size_t r, const cq_xq *xq) {
    float acc = 0.0f;
    const int min = ggml_q32_has_min(m->dtype);
    for (size_t g = 0; g < m->cols / CQ_GROUP; g++) {
        int32_t q[32], isum = 0;
        float d, mn;
        ggml_q32_codes(m->dtype, ggml_q32_block(m, r, g), q, &d, &mn);
        for (int k = 0; k < 32; k++) isum += q[k] * (int32_t)xq->q[CQ_GROUP * g + k];
        acc += (d * xq->d[g]) * (float)isum;
        if (min) acc += (mn * xq->d[g]) * (float)(xq->bias[2 * g] + xq->bias[2 * g + 1]);
    }
    return acc;
}
#endif
