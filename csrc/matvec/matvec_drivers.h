/* matvec_drivers.h -- the thread/row drivers of the matvec family, compiled once per
 * ISA file. The including file defines, before including this header:
 *   static float dot_row(const cq_qmat *m, size_t r, const float *xp);
 *   static void dequant_row(const cq_qmat *m, size_t r, float *out);
 *   static int needs_prep(const cq_qmat *m);           -- x must be transformed first
 *   static void prep_x(const cq_qmat *m, const float *x, float *xp);
 *   static void matmat_block(const float *w, size_t nr, size_t cols, const float *X,
 *                            size_t t, float *Y, size_t ldy);  -- Y[i*ldy + j] for j < nr
 *   #define CQ_MM_ROWS  rows decoded per block in matmat
 * Row r of every output is computed by exactly one thread, with the same code and
 * order whatever the thread count, so results are bit-identical for any count. */
#ifndef CQ_MATVEC_DRIVERS_H
#define CQ_MATVEC_DRIVERS_H
#include "qmat.h"
#include "../scratch.h"
#include <stdlib.h>
#ifdef CORTIQ_HAVE_OPENMP
#include <omp.h>
#endif

/* Below this many weights a call stays on the calling thread (thread start-up would
 * cost more than the work). Does not change any result. */
#define CQ_PAR_MIN ((size_t)1 << 16)


static cq_status drv_check(const cq_qmat *m) {
    if (m->dtype == CQ_DT_VBIT || m->dtype == CQ_DT_VBIT_RO) /* validated by prepare_rows */
        return m->rowoff ? CQ_OK : CQ_ERR_ARG;
    size_t need = cq_qmat_nbytes(m->dtype, m->rows, m->cols);
    if (need == 0 && m->rows * m->cols != 0) return CQ_ERR_UNSUPPORTED;
    switch (m->dtype) {
    case CQ_DT_F32: case CQ_DT_F16: case CQ_DT_BF16: case CQ_DT_Q8_ROW: case CQ_DT_Q8_2F:
    case CQ_DT_Q4_BLOCK: case CQ_DT_Q4_TILED: case CQ_DT_Q4TP: case CQ_DT_Q2TP: break;
    default: return CQ_ERR_UNSUPPORTED;
    }
    if (m->nbytes < need) return CQ_ERR_SHAPE;
    if (cq_qmat_aux_len(m->dtype, m->rows, m->cols) && !m->aux) return CQ_ERR_ARG;
    return CQ_OK;
}

/* Inside a parallel region (or serially): y[r] for every row, rows split statically
 * over the team. No barrier at the end (nowait). */
static void drv_rows(const cq_qmat *m, const float *xp, float *y) {
    long rows = (long)m->rows;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp for schedule(static) nowait
#endif
    for (long r = 0; r < rows; r++) y[r] = dot_row(m, (size_t)r, xp);
}

static cq_status drv_matvec(const cq_qmat *m, const float *x, float *y) {
    cq_status st = drv_check(m);
    if (st != CQ_OK) return st;
    const float *xp = x;
    float *tmp = NULL;
    if (needs_prep(m)) {
        tmp = (float *)malloc((m->cols ? m->cols : 1) * sizeof(float));
        if (!tmp) return CQ_ERR_NOMEM;
        prep_x(m, x, tmp);
        xp = tmp;
    }
    int par = m->rows * m->cols >= CQ_PAR_MIN;
    (void)par;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel num_threads(cq_get_num_threads()) if (par)
#endif
    drv_rows(m, xp, y);
    free(tmp);
    return CQ_OK;
}

static cq_status drv_matvec_many(const cq_qmat *ms, size_t n, const float *x, float *const *ys) {
    size_t total = 0, nprep = 0;
    for (size_t i = 0; i < n; i++) {
        cq_status st = drv_check(&ms[i]);
        if (st != CQ_OK) return st;
        if (ms[i].cols != ms[0].cols) return CQ_ERR_SHAPE;
        total += ms[i].rows * ms[i].cols;
        nprep += needs_prep(&ms[i]);
    }
    if (n == 0) return CQ_OK;
    size_t cols = ms[0].cols;
    float *tmp = NULL;
    const float *xps[64];
    const float **xpv = n <= 64 ? xps : (const float **)malloc(n * sizeof(*xpv));
    if (!xpv) return CQ_ERR_NOMEM;
    if (nprep) {
        tmp = (float *)malloc(nprep * (cols ? cols : 1) * sizeof(float));
        if (!tmp) {
            if (xpv != xps) free((void *)xpv);
            return CQ_ERR_NOMEM;
        }
    }
    for (size_t i = 0, k = 0; i < n; i++) {
        if (needs_prep(&ms[i])) {
            prep_x(&ms[i], x, tmp + k * cols);
            xpv[i] = tmp + k * cols;
            k++;
        } else {
            xpv[i] = x;
        }
    }
    int par = total >= CQ_PAR_MIN;
    (void)par;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel num_threads(cq_get_num_threads()) if (par)
#endif
    {
        for (size_t i = 0; i < n; i++) {
            drv_rows(&ms[i], xpv[i], ys[i]);
        }
    }
    free(tmp);
    if (xpv != xps) free((void *)xpv);
    return CQ_OK;
}

static cq_status drv_matmat(const cq_qmat *m, const float *X, size_t t, float *Y) {
    cq_status st = drv_check(m);
    if (st != CQ_OK) return st;
    size_t rows = m->rows, cols = m->cols;
    if (rows == 0 || t == 0) return CQ_OK;
    long nblocks = (long)((rows + CQ_MM_ROWS - 1) / CQ_MM_ROWS);
    int failed = 0;

    int par = rows * cols >= CQ_PAR_MIN / 4 && nblocks > 1;
    (void)par;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel num_threads(cq_get_num_threads()) if (par)
#endif
    {
        float *w = cq_thread_scratch(CQ_MM_ROWS * (cols ? cols : 1) * sizeof(float) + 64, &failed);
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp for schedule(static)
#endif
        for (long b = 0; b < nblocks; b++) {
            if (!w) continue;
            size_t r0 = (size_t)b * CQ_MM_ROWS;
            size_t nr = rows - r0 < CQ_MM_ROWS ? rows - r0 : CQ_MM_ROWS;
            for (size_t j = 0; j < nr; j++) dequant_row(m, r0 + j, w + j * cols);
            matmat_block(w, nr, cols, X, t, Y + r0, rows);
        }
        free(w);
    }
    return failed ? CQ_ERR_NOMEM : CQ_OK;
}

static cq_status drv_dequant_rows(const cq_qmat *m, size_t r0, size_t nr, float *out) {
    cq_status st = drv_check(m);
    if (st != CQ_OK) return st;
    if (r0 > m->rows || nr > m->rows - r0) return CQ_ERR_ARG;
    size_t cols = m->cols;
    long n = (long)nr;
    int par = nr * cols >= CQ_PAR_MIN;
    (void)par;
#ifdef CORTIQ_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(cq_get_num_threads()) if (par)
#endif
    for (long j = 0; j < n; j++) dequant_row(m, r0 + (size_t)j, out + (size_t)j * cols);
    return CQ_OK;
}

/* Serial: rows r0 .. r0+nr-1 against one x. The prepared x lives on the stack up to
 * CQ_XSTACK floats (no allocation for the usual widths), else on the heap. */
#define CQ_XSTACK 4096
static cq_status drv_rows_dot(const cq_qmat *m, size_t r0, size_t nr, const float *x, float *out) {
    cq_status st = drv_check(m);
    if (st != CQ_OK) return st;
    if (r0 > m->rows || nr > m->rows - r0) return CQ_ERR_ARG;
    const float *xp = x;
    float stackbuf[CQ_XSTACK];
    float *tmp = NULL;
    if (needs_prep(m) && nr) {
        if (m->cols <= CQ_XSTACK) {
            prep_x(m, x, stackbuf);
            xp = stackbuf;
        } else {
            tmp = (float *)malloc(m->cols * sizeof(float));
            if (!tmp) return CQ_ERR_NOMEM;
            prep_x(m, x, tmp);
            xp = tmp;
        }
    }
    for (size_t j = 0; j < nr; j++) out[j] = dot_row(m, r0 + j, xp);
    free(tmp);
    return CQ_OK;
}

static cq_status drv_row_dot(const cq_qmat *m, size_t r, const float *x, float *res) {
    return drv_rows_dot(m, r, 1, x, res);
}

#define CQ_MATVEC_OPS(name) \
    const cq_matvec_ops name = {drv_matvec, drv_matvec_many, drv_matmat, drv_dequant_rows, drv_row_dot, \
                                drv_rows_dot}

#endif
