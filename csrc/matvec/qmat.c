/* qmat.c -- payload sizes and the decoded side tables of cq_qmat (ISA-independent). */
#include "qmat.h"
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
    default: return 0;
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
