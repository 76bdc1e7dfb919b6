/* matvec_scalar.h -- the scalar row decoder of the reference, shared with the scalar
 * fallbacks of the SIMD twins (odd shapes). Every file is compiled with
 * -ffp-contract=off, so this code computes the same bits in every ISA file. */
#ifndef CQ_MATVEC_SCALAR_H
#define CQ_MATVEC_SCALAR_H
#include "qmat.h"
#include "ggml_kq_scalar.h"

/* 5-bit tile code g of a q4tp/q2tp row (LSB-first, may straddle two bytes). */
static inline unsigned tp_code(const uint8_t *cb, size_t stride, size_t g) {
    size_t bit = 5 * g, byte = bit >> 3;
    unsigned v = cb[byte];
    if (byte + 1 < stride) v |= (unsigned)cb[byte + 1] << 8;
    return (v >> (bit & 7)) & 31u;
}

/* Decode row r: with out != NULL store the weights, else return sum w * x. */
static float ref_row(const cq_qmat *m, size_t r, const float *x, float *out) {
    const size_t cols = m->cols, rows = m->rows;
    const uint8_t *d = m->data;
    float acc = 0.0f;
#define EMIT(c, wexpr)                  \
    do {                                \
        float w_ = (wexpr);             \
        if (out) out[c] = w_;           \
        else acc += w_ * x[c];          \
    } while (0)
    switch (m->dtype) {
    case CQ_DT_F32: {
        const uint8_t *p = d + 4 * r * cols;
        for (size_t c = 0; c < cols; c++) EMIT(c, cq_ldf32(p + 4 * c));
        break;
    }
    case CQ_DT_F16: {
        const uint8_t *p = d + 2 * r * cols;
        for (size_t c = 0; c < cols; c++) EMIT(c, cq_h2f(cq_ld16(p + 2 * c)));
        break;
    }
    case CQ_DT_BF16: {
        const uint8_t *p = d + 2 * r * cols;
        for (size_t c = 0; c < cols; c++) EMIT(c, cq_bf2f(cq_ld16(p + 2 * c)));
        break;
    }
    case CQ_DT_Q8_ROW: {
        const int8_t *q = (const int8_t *)(d + r * cols);
        float s = m->aux[r];
        for (size_t c = 0; c < cols; c++) EMIT(c, (float)q[c] * s);
        break;
    }
    case CQ_DT_Q8_2F: {
        const int8_t *q = (const int8_t *)(d + r * cols);
        float s = m->aux[r];
        const float *col = m->aux + rows;
        for (size_t c = 0; c < cols; c++) EMIT(c, ((float)q[c] * s) * col[c]);
        break;
    }
    case CQ_DT_Q4_BLOCK:
    case CQ_DT_Q4_TILED: {
        size_t G = cq_ceil32(rows * cols);
        int tiled = m->dtype == CQ_DT_Q4_TILED;
        for (size_t c = 0; c < cols; c++) {
            size_t i = r * cols + c, g = i / CQ_GROUP, k = i % CQ_GROUP;
            const uint8_t *nib = tiled ? d + 18 * g + 2 : d + 16 * g;
            const uint8_t *sp = tiled ? d + 18 * g : d + 16 * G + 2 * g;
            unsigned b = nib[k >> 1];
            int q = (int)((k & 1) ? b >> 4 : b & 15u) - 8;
            EMIT(c, (float)q * cq_h2f(cq_ld16(sp)));
        }
        break;
    }
    case CQ_DT_Q4TP:
    case CQ_DT_Q2TP: {
        size_t gpr = cq_tp_gpr(cols), stride = cq_tp_stride(cols), tile = cq_tp_tile(m->dtype);
        const uint8_t *body = d + r * gpr * tile;
        const uint8_t *cb = d + rows * gpr * tile + 4 * rows + r * stride;
        const float *ladder = m->aux + 32 * r;
        for (size_t g = 0; g < gpr; g++) {
            float s = ladder[tp_code(cb, stride, g)];
            const uint8_t *p = body + g * tile;
            for (size_t k = 0; k < CQ_GROUP; k++) {
                size_t c = g * CQ_GROUP + k;
                if (tile == 16) {
                    unsigned b = p[k >> 1];
                    int q = (int)((k & 1) ? b >> 4 : b & 15u) - 8;
                    EMIT(c, (float)q * s);
                } else {
                    unsigned v = (p[k >> 2] >> (2 * (k & 3))) & 3u;
                    EMIT(c, ((float)v - 1.5f) * s);
                }
            }
        }
        break;
    }
    case CQ_DT_VBIT:
    case CQ_DT_VBIT_RO: { /* MSB-first codes of b bits; w = (u - (2^(b-1) - 1)) * scale */
        unsigned b = d[r];
        int lvl = (1 << (b - 1)) - 1;
        size_t gpr = cols / CQ_GROUP;
        const uint8_t *sp = d + rows + 2 * r * gpr;
        const uint8_t *p = d + m->rowoff[r];
        size_t nb = (size_t)(m->rowoff[r + 1] - m->rowoff[r]);
        for (size_t g = 0; g < gpr; g++) {
            float s = cq_h2f(cq_ld16(sp + 2 * g));
            for (size_t k = 0; k < CQ_GROUP; k++) {
                size_t c = g * CQ_GROUP + k, bit = c * b, byte = bit >> 3;
                unsigned v = (unsigned)p[byte] << 8;
                if (byte + 1 < nb) v |= p[byte + 1];
                unsigned u = (v >> (16 - (bit & 7) - b)) & ((1u << b) - 1);
                EMIT(c, (float)((int)u - lvl) * s);
            }
        }
        break;
    }
    default: return kq_is(m->dtype) ? kq_ref_row(m, r, x, out) : 0.0f;
    }
#undef EMIT
    return acc;
}

/* Group g of row r of a q4 dtype (cols % 32 == 0): its 16 nibble bytes and scale. */
static inline const uint8_t *q4_group(const cq_qmat *m, size_t r, size_t g, float *sw) {
    const size_t gpr = m->cols / CQ_GROUP, i = r * gpr + g;
    const uint8_t *d = m->data;
    switch (m->dtype) {
    case CQ_DT_Q4_BLOCK:
        *sw = cq_h2f(cq_ld16(d + 16 * m->rows * gpr + 2 * i));
        return d + 16 * i;
    case CQ_DT_Q4_TILED:
        *sw = cq_h2f(cq_ld16(d + 18 * i));
        return d + 18 * i + 2;
    default: { /* q4tp */
        const size_t stride = cq_tp_stride(m->cols);
        const uint8_t *cb = d + m->rows * gpr * 16 + 4 * m->rows + r * stride;
        *sw = m->aux[32 * r + tp_code(cb, stride, g)];
        return d + 16 * i;
    }
    }
}

/* Does the int8-activation path take this matrix (act = int8, a dtype with a
 * family, whole groups)? */
static inline int i8_takes(const cq_qmat *m) {
    return m->act == CQ_ACT_INT8 && cq_xq_family(m->dtype) >= 0 && m->cols % CQ_GROUP == 0 && m->cols > 0;
}

/* Element k (0..31) of group g of xq, wherever its family put it. */
static inline int32_t xq_at(const cq_xq *xq, size_t g, int k) {
    switch (xq->family) {
    case CQ_XQ_Q4: return xq->q[128 * (g / 4) + 64 * (k & 1) + 16 * (g % 4) + k / 2];
    case CQ_XQ_Q8: case CQ_XQ_G32: return xq->q[32 * g + k];
    default: return xq->q[256 * (g / 8) + 64 * (k & 3) + 8 * (g % 8) + k / 4];
    }
}

/* The int8-activation row, the spec of its SIMD twins. Per group g the exact integer
 * sum isum = sum_k q_k * xq_k of the weights' integers (q4: nibble - 8; q8: the stored
 * int8; q2tp: 2v - 3), then in group order
 *   q4, q2tp:      acc += (sw_g * d_g) * isum   (q2tp: sw_g = tile scale * 0.5, exact)
 *   q8_row, q8_2f: acc += d_g * isum, and the row's result is acc * row scale
 * (q8_2f quantizes col * x, computed in float32 as the exact path's prep_x does). The
 * SIMD kernels compute the same integers (the q4/q2 ones from u8 weights plus the
 * family's bias) and combine them in another order. */
static float ref_i8_row(const cq_qmat *m, size_t r, const cq_xq *xq) {
    const size_t gpr = m->cols / CQ_GROUP;
    float acc = 0.0f;
    if (kq_is(m->dtype)) return kq_ref_i8_row(m, r, xq);
    switch (m->dtype) {
    case CQ_DT_Q8_ROW:
    case CQ_DT_Q8_2F: {
        const int8_t *w = (const int8_t *)(m->data + r * m->cols);
        for (size_t g = 0; g < gpr; g++) {
            int32_t isum = 0;
            for (int k = 0; k < CQ_GROUP; k++) isum += (int32_t)w[CQ_GROUP * g + k] * xq_at(xq, g, k);
            acc += xq->d[g] * (float)isum;
        }
        return acc * m->aux[r];
    }
    case CQ_DT_Q2TP: {
        const size_t stride = cq_tp_stride(m->cols);
        const uint8_t *body = m->data + 8 * r * gpr;
        const uint8_t *cb = m->data + m->rows * gpr * 8 + 4 * m->rows + r * stride;
        for (size_t g = 0; g < gpr; g++) {
            const float sw = m->aux[32 * r + tp_code(cb, stride, g)] * 0.5f;
            int32_t isum = 0;
            for (int k = 0; k < CQ_GROUP; k++) {
                const int v = (body[8 * g + k / 4] >> (2 * (k & 3))) & 3;
                isum += (2 * v - 3) * xq_at(xq, g, k);
            }
            acc += (sw * xq->d[g]) * (float)isum;
        }
        return acc;
    }
    default: /* q4 */
        for (size_t g = 0; g < gpr; g++) {
            float sw;
            const uint8_t *nib = q4_group(m, r, g, &sw);
            int32_t isum = 0;
            for (int k = 0; k < CQ_GROUP; k++) {
                const int u = (k & 1) ? nib[k / 2] >> 4 : nib[k / 2] & 15;
                isum += (u - 8) * xq_at(xq, g, k);
            }
            acc += (sw * xq->d[g]) * (float)isum;
        }
        return acc;
    }
}

#endif
