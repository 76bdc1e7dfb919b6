/* qmat.c -- payload sizes and the decoded side tables of cq_qmat (ISA-independent). */
#include "qmat.h"
#include "ggml_kq_scalar.h"
#include <math.h>

size_t cq_qmat_nbytes(int dtype, size_t rows, size_t cols) {
    size_t n = rows * cols;
    switch (dtype) {
    case CQ_DT_F32: return 4 * n;
    case CQ_DT_F16:
    case CQ_DT_BF16: return 2 * n;
    case CQ_DT_Q8_ROW: return n + 2 * rows;
    case CQ_DT_Q8_2F: return n + 2 * rows + 2 * cols;
    case CQ_DT_Q4_BLOCK:
    case CQ_DT_Q4_TILED: return 18 * cq_ceil32(n);
    case CQ_DT_Q4TP:
    case CQ_DT_Q2TP:
        if (cols % CQ_GROUP) return 0;
        return rows * cq_tp_gpr(cols) * cq_tp_tile(dtype) + 4 * rows + rows * cq_tp_stride(cols);
    default: return kq_is(dtype) ? kq_nbytes(dtype, rows, cols) : 0;
    }
}

size_t cq_qmat_aux_len(int dtype, size_t rows, size_t cols) {
    switch (dtype) {
    case CQ_DT_Q8_ROW: return rows;
    case CQ_DT_Q8_2F: return rows + cols;
    case CQ_DT_Q4TP:
    case CQ_DT_Q2TP: return 32 * rows;
    default: return 0;
    }
}

cq_status cq_qmat_prepare(const cq_qmat *m, float *aux) {
    size_t rows = m->rows, cols = m->cols, n = rows * cols;
    size_t need = cq_qmat_nbytes(m->dtype, rows, cols);
    if (need == 0 && rows * cols != 0) return CQ_ERR_UNSUPPORTED;
    if (m->nbytes < need) return CQ_ERR_SHAPE;
    switch (m->dtype) {
    case CQ_DT_Q8_ROW:
        for (size_t r = 0; r < rows; r++) aux[r] = cq_h2f(cq_ld16(m->data + n + 2 * r));
        break;
    case CQ_DT_Q8_2F:
        for (size_t r = 0; r < rows; r++) aux[r] = cq_h2f(cq_ld16(m->data + n + 2 * r));
        for (size_t c = 0; c < cols; c++) aux[rows + c] = cq_h2f(cq_ld16(m->data + n + 2 * rows + 2 * c));
        break;
    case CQ_DT_Q4TP:
    case CQ_DT_Q2TP: {
        const uint8_t *params = m->data + rows * cq_tp_gpr(cols) * cq_tp_tile(m->dtype);
        for (size_t r = 0; r < rows; r++) {
            float lo = cq_h2f(cq_ld16(params + 4 * r)), step = cq_h2f(cq_ld16(params + 4 * r + 2));
            float t[32];
            t[0] = exp2f(lo);
            float mul = exp2f(step);
            for (int c = 1; c < 32; c++) t[c] = t[c - 1] * mul;
            float *a = aux + 32 * r;
            if (m->dtype == CQ_DT_Q4TP) {
                for (int c = 0; c < 32; c++) a[c] = t[c];
            } else {
                a[0] = 0.0f;
                for (int c = 1; c < 32; c++) a[c] = t[c - 1];
            }
        }
        break;
    }
    default: break;
    }
    return CQ_OK;
}

cq_status cq_qmat_prepare_rows(const cq_qmat *m, uint64_t *rowoff) {
    size_t rows = m->rows, cols = m->cols;
    if (m->dtype != CQ_DT_VBIT && m->dtype != CQ_DT_VBIT_RO) return CQ_ERR_UNSUPPORTED;
    if (cols == 0 || cols % CQ_GROUP) return CQ_ERR_SHAPE;
    size_t gpr = cols / CQ_GROUP;
    size_t base = rows + 2 * rows * gpr + (m->dtype == CQ_DT_VBIT_RO ? 4 * (rows + 1) : 0);
    if (m->nbytes < base) return CQ_ERR_SHAPE;
    uint64_t off = base;
    for (size_t r = 0; r < rows; r++) {
        unsigned b = m->data[r];
        if (b != 3 && b != 4 && b != 5 && b != 6 && b != 8) return CQ_ERR_ARG;
        if (m->dtype == CQ_DT_VBIT_RO) {
            const uint8_t *o = m->data + rows + 2 * rows * gpr + 4 * r;
            uint32_t rel = (uint32_t)o[0] | ((uint32_t)o[1] << 8) | ((uint32_t)o[2] << 16) | ((uint32_t)o[3] << 24);
            if ((uint64_t)rel + base != off) return CQ_ERR_ARG;
        }
        rowoff[r] = off;
        off += (cols * b + 7) / 8;
    }
    rowoff[rows] = off;
    if (m->dtype == CQ_DT_VBIT_RO) {
        const uint8_t *o = m->data + rows + 2 * rows * gpr + 4 * rows;
        uint32_t rel = (uint32_t)o[0] | ((uint32_t)o[1] << 8) | ((uint32_t)o[2] << 16) | ((uint32_t)o[3] << 24);
        if ((uint64_t)rel + base != off) return CQ_ERR_ARG;
    }
    if (off != m->nbytes) return CQ_ERR_SHAPE;
    return CQ_OK;
}

/* ---- int8 activations (see qmat.h) ---- */
/* Groups a family's block holds, and the bytes of each of its four sections (q, bias,
 * dl, d; every section a multiple of 64 bytes). */
static size_t xq_per_block(int family) {
    return family == CQ_XQ_Q2 ? 8 : (family == CQ_XQ_Q8 || family == CQ_XQ_G32) ? 2 : 4;
}
static size_t xq_blocks(int family, size_t cols) {
    const size_t nb = (cols / CQ_GROUP + xq_per_block(family) - 1) / xq_per_block(family);
    return nb ? nb : 1;
}

size_t cq_xq_bytes(int family, size_t cols) {
    const size_t nb = xq_blocks(family, cols), qb = 32 * xq_per_block(family) * nb;
    return qb + 3 * 64 * nb;
}

void cq_xq_view(int family, void *buf, size_t cols, cq_xq *xq) {
    const size_t nb = xq_blocks(family, cols), per = xq_per_block(family);
    uint8_t *b = (uint8_t *)buf;
    xq->family = family;
    xq->q = (const int8_t *)b;
    b += 32 * per * nb;
    xq->bias = family == CQ_XQ_Q8 ? NULL : (const int32_t *)b;
    b += 64 * nb;
    xq->dl = (const float *)b;
    b += 64 * nb;
    xq->d = (const float *)b; /* per groups of a block: at most 8 floats = 32 bytes */
    for (size_t g = cols / CQ_GROUP; g < per * nb; g++) cq_xq_group(xq, g, NULL); /* padding */
}

float cq_xq_quant32(const float *xg, int8_t *q) {
    float amax = 0.0f, id = 0.0f;
    int finite = 1;
    if (xg) {
        for (int k = 0; k < CQ_GROUP; k++) {
            float a = fabsf(xg[k]);
            if (!(a <= 3.4028234663852886e38f)) { /* inf or NaN */
                finite = 0;
                amax = a;
                break;
            }
            if (a > amax) amax = a;
        }
        if (finite && amax > 0.0f) id = 127.0f / amax;
    }
    for (int k = 0; k < CQ_GROUP; k++) q[k] = (int8_t)(id != 0.0f ? lrintf(xg[k] * id) : 0);
    return finite ? amax / 127.0f : amax;
}

void cq_xq_put(const cq_xq *xq, size_t g, const int8_t *q, float d) {
    int8_t *xb = (int8_t *)xq->q;
    int32_t *bias = (int32_t *)xq->bias;
    float *dl = (float *)xq->dl;
    ((float *)xq->d)[g] = d;
    switch (xq->family) {
    case CQ_XQ_Q4: {
        int8_t *qe = xb + 128 * (g / 4) + 16 * (g % 4), *qo = qe + 64;
        for (int k = 0; k < 16; k++) {
            qe[k] = q[2 * k];
            qo[k] = q[2 * k + 1];
        }
        for (int j = 0; j < 4; j++) {
            int s = 0;
            for (int i = 0; i < 8; i++) s += q[8 * j + i];
            bias[4 * g + j] = -8 * s;
            dl[4 * g + j] = d;
        }
        break;
    }
    case CQ_XQ_Q8:
    case CQ_XQ_G32:
        memcpy(xb + 32 * g, q, 32);
        for (int j = 0; j < 8; j++) dl[8 * g + j] = d;
        if (xq->family == CQ_XQ_G32)
            for (int h = 0; h < 2; h++) {
                int s = 0;
                for (int i = 0; i < 16; i++) s += q[16 * h + i];
                bias[2 * g + h] = s;
            }
        break;
    default: { /* CQ_XQ_Q2 */
        int8_t *p = xb + 256 * (g / 8) + 8 * (g % 8);
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 8; k++) p[64 * j + k] = q[4 * k + j];
        for (int h = 0; h < 2; h++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += q[16 * h + i];
            bias[2 * g + h] = -3 * s;
            dl[2 * g + h] = d;
        }
    }
    }
}

void cq_xq_group(const cq_xq *xq, size_t g, const float *xg) {
    int8_t q[CQ_GROUP];
    const float d = cq_xq_quant32(xg, q);
    cq_xq_put(xq, g, q, d);
}

void cq_xq_build(int family, const float *x, size_t cols, void *buf, cq_xq *xq) {
    cq_xq_view(family, buf, cols, xq);
    for (size_t g = 0; g < cols / CQ_GROUP; g++) cq_xq_group(xq, g, x + CQ_GROUP * g);
}
