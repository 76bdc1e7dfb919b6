/* matvec_ref.c -- scalar reference of the matvec family: the spec. Each weight is
 * decoded exactly as docs/cmf-format.md §7 writes it (float32, in the order written) and
 * accumulated as acc += w * x[c] in column order. */
#include "qmat.h"

#include "matvec_scalar.h"

static float dot_row(const cq_qmat *m, size_t r, const float *x) { return ref_row(m, r, x, NULL); }
static void dequant_row(const cq_qmat *m, size_t r, float *out) { (void)ref_row(m, r, NULL, out); }
static int needs_prep(const cq_qmat *m) { (void)m; return 0; }

static void prep_x(const cq_qmat *m, const float *x, float *xp) { (void)m; (void)x; (void)xp; }

/* Y[i, j] = sum_c w[j, c] * X[i, c] in column order: identical to dot_row, so the
 * reference matmat equals the reference matvec bit for bit. */
static void matmat_block(const float *w, size_t nr, size_t cols, const float *X, size_t t,
                         float *Y, size_t ldy) {
    for (size_t i = 0; i < t; i++)
        for (size_t j = 0; j < nr; j++) {
            const float *wr = w + j * cols, *xr = X + i * cols;
            float acc = 0.0f;
            for (size_t c = 0; c < cols; c++) acc += wr[c] * xr[c];
            Y[i * ldy + j] = acc;
        }
}
#define CQ_MM_ROWS 8

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_ref);
