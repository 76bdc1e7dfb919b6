/* matvec_avx2.c -- AVX2/FMA twin of matvec_ref.c (row kernels in matvec_avx2_impl.h). */
#include "matvec_avx2_impl.h"

#define dot_row avx2_dot_row
#define dequant_row avx2_dequant_row
#define needs_prep avx2_needs_prep
#define prep_x avx2_prep_x
#define matmat_block avx2_matmat_block
#define CQ_HAVE_XQ_BUILD
#define xq_build avx2_xq_build
#define CQ_HAVE_I8_ROWS
static void i8_dot_rows(const cq_qmat *m, size_t r0, size_t nr, const cq_xq *xq, float *out) {
    for (size_t j = 0; j < nr; j++) out[j] = avx2_i8_row(m, r0 + j, xq);
}

/* Rows decoded per matmat block: the block (CQ_MM_ROWS x cols floats) stays in L2. */
#define CQ_MM_ROWS 16

#include "matvec_drivers.h"

CQ_MATVEC_OPS(cq_matvec_avx2);
